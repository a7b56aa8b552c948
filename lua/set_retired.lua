--[[ set_retired.lua — rewrites the list of retired layouts, if nothing moved.

KEYS[1] ss:{e}:meta   ARGV[1] generation: the one the caller read
ARGV[2] layouts: those still holding records or units ("gen:count,gen:count"; '' = none)

Returns 1 when written, 0 when the event is no longer on sale in generation ARGV[1]
(a reshard began or switched layouts since the caller read the meta):
nothing changed. The leader drops drained layouts with this; a compare-and-set,
because writing the whole layout (set_layout.lua) from a stale read switched an
event back to the layout a reshard had just left.
]]
if redis.call('HGET', KEYS[1], 'status') ~= 'on_sale' or redis.call('HGET', KEYS[1], 'gen') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'retired', ARGV[2])
return 1
