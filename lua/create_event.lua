--[[ create_event.lua — writes an event's meta, unless the event exists.

KEYS[1] ss:{e}:meta   HASH
ARGV[1] id  ARGV[2] stock  ARGV[3] buckets  ARGV[4] per_user_limit (0 = none)
ARGV[5] max_per_order  ARGV[6] starts_at ms ('' = none)  ARGV[7] ends_at ms ('' = none)
ARGV[8] now ms  ARGV[9] hold_seconds ('' = purchases are confirmed at once)
ARGV[10] auto_buckets: the adaptive bucket range 'min-max' ('' = the count stays as set)
ARGV[11] token_keys: the `token` access mode's keys, space-separated ('' = the open mode)
ARGV[12] draw: the `draw` access mode's settings (domain::draw::DrawSpec, '' = none)
The layout history starts with this layout: 'history' = '0:<buckets>:<now>:created'
(end_reshard.lua appends to it).

Returns {"OK"} when written (status "creating", gen 0, seq 0), {"EX"} when the
event exists (nothing changed: an existing event is never overwritten).
The engine then initialises the buckets and moves the status to "on_sale";
until then nothing sells, so a crash half-way is resumed by creating again.
]]
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'EX'}
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'stock', ARGV[2], 'buckets', ARGV[3],
  'limit', ARGV[4], 'max_per_order', ARGV[5], 'starts_at', ARGV[6], 'ends_at', ARGV[7],
  'created', ARGV[8], 'hold', ARGV[9] or '', 'auto', ARGV[10] or '', 'tokens', ARGV[11] or '', 'draw', ARGV[12] or '', 'history', '0:' .. ARGV[3] .. ':' .. ARGV[8] .. ':created', 'status', 'creating', 'gen', 0, 'seq', 0, 'soldout', '', 'retired', '', 'reshard_to', '')
return {'OK'}
