--[[ restore.lua — writes what a rebuilt bucket must remember, from the ledger,
after Redis lost its state (the bucket's stock is set by init_bucket.lua).

KEYS[1] ss:{e#g#b}:users   KEYS[2] ss:{e#g#b}:idx   KEYS[3] ss:{e#g#b}:reqs
ARGV[1] n users, then n pairs: user, units held
ARGV[2+2n] m orders, then m triples: order id, index entry, request id ('' = none)
        followed, for each order with a request id, by nothing more: the record
        "B|q|oid|bucket|0" is derived here from the entry.

Returns {users written, orders written}. Idempotent (HSET of the same values),
so an interrupted rebuild can simply run again.
]]
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[2 + 2 * i], ARGV[3 + 2 * i])
end
local a = 2 + 2 * n
local m = tonumber(ARGV[a])
for i = 0, m - 1 do
  local oid, entry, rid = ARGV[a + 1 + 3 * i], ARGV[a + 2 + 3 * i], ARGV[a + 3 + 3 * i]
  redis.call('HSET', KEYS[2], oid, entry)
  if rid ~= '' then
    local qty, bucket = string.match(entry, '^C|[^|]*|([^|]*)|([^|]*)|')
    redis.call('HSET', KEYS[3], rid, 'B|' .. qty .. '|' .. oid .. '|' .. bucket .. '|0')
  end
end
return {n, m}
