--[[ restore.lua — writes what a bucket must remember when it is rebuilt from
the ledger (Redis lost its state) or filled by a reshard (its users moved here).
The bucket's stock is set separately (init_bucket.lua, transfers).

KEYS[1] ss:{e#g#b}:users   KEYS[2] ss:{e#g#b}:idx   KEYS[3] ss:{e#g#b}:reqs
KEYS[4] ss:{e#g#b}:fence   highest fencing token the bucket has accepted
KEYS[5] ss:{e#g#b}:holds   ZSET order id -> pay-by ms  KEYS[6] ss:{e#g#b}:hunits
KEYS[7] ss:{e#g#b}:tok     HASH access tokens of users homed here (purchase.lua)
ARGV[1] token: the writer's fencing token (a reshard's mover-lease token; 0 for a
        rebuild into a fresh layout no mover has fenced yet)
ARGV[2] n, then n pairs (i = 1..n):
  ARGV[2 + 2i - 1] user   ARGV[2 + 2i] units held
ARGV[3 + 2n] m, then m pairs (j = 1..m):
  ARGV[3 + 2n + 2j - 1] order   ARGV[3 + 2n + 2j] entry: its index entry
        ("C|user|qty|bucket|rid|at"); an
        entry of a live hold ("H|user|qty|bucket|rid|at|pay_by") also goes into
        the deadline index KEYS[5] and its units into KEYS[6], only when this
        call wrote the entry
ARGV[4 + 2n + 2m] r, then r pairs (k = 1..r):
  ARGV[4 + 2n + 2m + 2k - 1] rid   ARGV[4 + 2n + 2m + 2k] record ("B|…", "L|…", "S|…")
ARGV[5 + 2n + 2m + 2r] t, then t pairs (l = 1..t), "token" events:
  ARGV[5 + 2n + 2m + 2r + 2l - 1] field: a token's "t:<token id>"
  ARGV[5 + 2n + 2m + 2r + 2l] used: the units it bought (a reshard moves a
        token's consumption with its user; its reservations were ended with
        the pending sagas before, by the sealed layout's settle)

Every field is written only where the bucket has none yet (HSETNX): the
source of a restore is frozen (a reshard's sealed old layout; a rebuild's
ledger, into a fresh generation), so a field already here is this source's
own value written by an earlier run, or something newer. A run resumed after
a crash must not bring back a hold that expired, was confirmed or was
cancelled here since, nor reset a buyer's count: a hold restored twice and
expired in between came back on sale twice before (1.8x the stock).

Returns:
  {"OK", n, m, r, t} written (the fence raised to the token)
  {"F", highest}    the bucket has accepted a higher token: nothing written.
                    A reshard run that stalled past its lease (another run
                    finished the reshard, or a close seized the lease) must
                    not overwrite the users, order index and request records
                    of a layout that may be live by now with its old snapshot.

Idempotent: an interrupted rebuild or reshard simply runs again; the fence
check and the writes are one step, so no stale writer slips in between.
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
-- Writes the next count-prefixed run of pairs into `key` where absent;
-- `fresh(field, value)` runs for each pair this call wrote.
local function pairs_into(key, fresh)
  local count = tonumber(ARGV[a])
  for i = 0, count - 1 do
    local field, value = ARGV[a + 1 + 2 * i], ARGV[a + 2 + 2 * i]
    if redis.call('HSETNX', key, field, value) == 1 and fresh then
      fresh(field, value)
    end
  end
  a = a + 1 + 2 * count
  return count
end
local n = pairs_into(KEYS[1])
local m = pairs_into(KEYS[2], function(oid, entry)
  local qty, pay_by = string.match(entry, '^H|[^|]*|([^|]*)|[^|]*|[^|]*|[^|]*|([^|]*)$')
  if qty then
    redis.call('ZADD', KEYS[5], pay_by, oid)
    redis.call('INCRBY', KEYS[6], qty)
  end
end)
local r = pairs_into(KEYS[3])
local t = ARGV[a] and pairs_into(KEYS[7]) or 0
return {'OK', n, m, r, t}
