--[[ restore.lua — writes what a bucket must remember when it is rebuilt from
the ledger (Redis lost its state) or filled by a reshard (its users moved here).
The bucket's stock is set separately (init_bucket.lua, transfers).

KEYS[1] ss:{e#g#b}:users   KEYS[2] ss:{e#g#b}:idx   KEYS[3] ss:{e#g#b}:reqs
ARGV[1] n, then n pairs: user, units held
then m, then m pairs: order id, index entry ("C|user|qty|bucket|rid|at")
then r, then r pairs: request id, record ("B|…", "L|…", "S|…")

Returns {n, m, r}. Idempotent (HSET of the same values), so an interrupted
rebuild or reshard can simply run again.
]]
local a = 1
local function pairs_into(key)
  local count = tonumber(ARGV[a])
  for i = 0, count - 1 do
    redis.call('HSET', key, ARGV[a + 1 + 2 * i], ARGV[a + 2 + 2 * i])
  end
  a = a + 1 + 2 * count
  return count
end
local n = pairs_into(KEYS[1])
local m = pairs_into(KEYS[2])
local r = pairs_into(KEYS[3])
return {n, m, r}
