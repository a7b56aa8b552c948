--[[ set_layout.lua — moves an event to another bucket layout.

KEYS[1] ss:{e}:meta   ARGV[1] generation   ARGV[2] buckets: the bucket count   ARGV[3] layouts
still holding records or units ("gen:count,gen:count"; '' = none)

Returns 1 (the meta now routes to generation ARGV[1] with ARGV[2] buckets), or
0 when the event has no meta. Used by a reshard (the new layout) and by a
rebuild from the ledger (a fresh generation, so no stream name is reused).
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'buckets', ARGV[2], 'retired', ARGV[3])
return 1
