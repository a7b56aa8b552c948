--[[ mark_sold_out.lua — records that a consistent probe found the event
holding fewer units than a buyer asked for.

KEYS[1] ss:{e}:meta   ARGV[1] seq: the one the probe started at
ARGV[2] mark: "seq|now|left" (domain::model::SoldOutMark), stored as given
Returns 1 when marked ("soldout" = the mark), 0 when the seq moved on
since (units were added during the probe: the mark would be false).
Readers trust the mark only while the seq is unchanged and the mark is young,
and refuse from it only orders of more than `left` units.
]]
if redis.call('HGET', KEYS[1], 'seq') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'soldout', ARGV[2])
return 1
