--[[ begin_reshard.lua — marks an event as moving to a new bucket layout.

KEYS[1] ss:{e}:meta   ARGV[1] generation: the new one   ARGV[2] buckets: the new count
Returns 1 when the event is now resharding to exactly that layout (just marked,
or already marked by an interrupted reshard that is being resumed), 0 when it
is not on sale or is resharding to another layout. While "resharding",
purchases wait for the new layout instead of selling from the old one.
]]
local target = ARGV[1] .. ':' .. ARGV[2]
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'on_sale' then
  redis.call('HSET', KEYS[1], 'status', 'resharding', 'reshard_to', target)
  return 1
end
if status == 'resharding' and redis.call('HGET', KEYS[1], 'reshard_to') == target then
  return 1
end
return 0
