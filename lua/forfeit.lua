--[[ forfeit.lua — takes units off sale: the repair after a partial loss.

KEYS[1] ss:{e#g#b}:stock   KEYS[2] ss:{e#g#b}:sealed   KEYS[3] ss:{e#g#b}:adds
ARGV[1] units wanted

Returns "ST" (no bucket), or the units taken: min(stock, wanted), 0 on a
sealed bucket (a close or a reshard owns what it holds).

When Redis loses writes the database has (a restart from an AOF missing its
last second, a failover to a replica that missed them), the ledger holds
orders whose decrements are gone: the buckets offer their units again, and
the audit finds that many units too many. The repair takes them off sale,
wherever they are (units are interchangeable), so no unit an acknowledged
order holds is sold twice. Atomic with the check, so a purchase in between
never drives the bucket negative; it counts as a step that changed the
bucket (`adds`, as a transfer's OUT does), so a double collect that saw the
bucket before it reads it again.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local stock = tonumber(redis.call('GET', KEYS[1]))
local take = math.min(stock, tonumber(ARGV[1]))
if take > 0 then
  redis.call('DECRBY', KEYS[1], take)
  redis.call('INCR', KEYS[3])
end
return take
