--[[ restore.lua — writes what a bucket must remember when it is rebuilt from
the ledger (Redis lost its state) or filled by a reshard (its users moved here).
The bucket's stock is set separately (init_bucket.lua, transfers).

KEYS[1] ss:{e#g#b}:users   KEYS[2] ss:{e#g#b}:idx   KEYS[3] ss:{e#g#b}:reqs
KEYS[4] ss:{e#g#b}:fence   highest fencing token the bucket has accepted
KEYS[5] ss:{e#g#b}:holds   ZSET order id -> pay-by ms  KEYS[6] ss:{e#g#b}:hunits
ARGV[1] the writer's fencing token (a reshard's mover-lease token; 0 for a
        rebuild into a fresh layout no mover has fenced yet)
ARGV[2] n, then n pairs: user, units held
then m, then m pairs: order id, index entry ("C|user|qty|bucket|rid|at"); an
        entry of a live hold ("H|user|qty|bucket|rid|at|pay_by") also goes into
        the deadline index KEYS[5] and its units into KEYS[6] (once: only
        when the ZADD added it, so a repeated restore counts nothing twice)
then r, then r pairs: request id, record ("B|…", "L|…", "S|…")

Returns:
  {"OK", n, m, r}   written (the fence raised to the token)
  {"F", highest}    the bucket has accepted a higher token: nothing written.
                    A reshard run that stalled past its lease (another run
                    finished the reshard, or a close seized the lease) must
                    not overwrite the users, order index and request records
                    of a layout that may be live by now with its old snapshot.

Idempotent for one writer (HSET of the same values), so an interrupted
rebuild or reshard can simply run again; the fence check and the writes are
one step, so no stale writer slips in between.
]]
local token = tonumber(ARGV[1])
local fence = tonumber(redis.call('GET', KEYS[4]) or '0')
if token < fence then
  return {'F', string.format('%d', fence)}
end
if token > fence then
  redis.call('SET', KEYS[4], ARGV[1])
end
local a = 2
local function pairs_into(key)
  local count = tonumber(ARGV[a])
  for i = 0, count - 1 do
    redis.call('HSET', key, ARGV[a + 1 + 2 * i], ARGV[a + 2 + 2 * i])
  end
  a = a + 1 + 2 * count
  return count
end
local n = pairs_into(KEYS[1])
local hstart = a
local m = pairs_into(KEYS[2])
for i = 0, m - 1 do
  local entry = ARGV[hstart + 2 + 2 * i]
  local qty, pay_by = string.match(entry, '^H|[^|]*|([^|]*)|[^|]*|[^|]*|[^|]*|([^|]*)$')
  if qty and redis.call('ZADD', KEYS[5], pay_by, ARGV[hstart + 1 + 2 * i]) == 1 then
    redis.call('INCRBY', KEYS[6], qty)
  end
end
local r = pairs_into(KEYS[3])
return {'OK', n, m, r}
