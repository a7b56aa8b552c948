--[[ mark_sold_out.lua — records that a consistent probe found the event empty.

KEYS[1] ss:{e}:meta   ARGV[1] the seq the probe started at   ARGV[2] now ms
Returns 1 when marked ("soldout" = "seq|now"), 0 when the seq moved on since
(units were added during the probe: the mark would be false).
Readers trust the mark only while the seq is unchanged and the mark is young.
]]
if redis.call('HGET', KEYS[1], 'seq') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'soldout', ARGV[1] .. '|' .. ARGV[2])
return 1
