--[[ end_reshard.lua — switches an event to its new layout and back on sale.

KEYS[1] ss:{e}:meta   ARGV[1] generation   ARGV[2] bucket count
ARGV[3] retired layouts still holding records ("gen:count,…")
Returns 1 when switched, 0 when the event was not resharding to that layout.
One step, so no instance ever sees the new layout without "on_sale" or the old
one after it.
]]
if redis.call('HGET', KEYS[1], 'reshard_to') ~= ARGV[1] .. ':' .. ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'buckets', ARGV[2], 'retired', ARGV[3],
  'status', 'on_sale', 'reshard_to', '')
redis.call('HINCRBY', KEYS[1], 'seq', 1)
return 1
