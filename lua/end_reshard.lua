--[[ end_reshard.lua — switches an event to its new layout and back on sale.

KEYS[1] ss:{e}:meta   KEYS[2] ss:{e}:lease (the mover lease: HASH o, t; or an older "owner|token")
ARGV[1] generation   ARGV[2] buckets: the bucket count
ARGV[3] layouts: retired layouts still holding records ("gen:count,…")
ARGV[4] owner: the reshard's lease owner   ARGV[5] token: its fencing token
ARGV[6] now ms   ARGV[7] why (manual, config, resumed, hot, spread, drain)
ARGV[8] history: layouts the history keeps (the oldest are dropped)
ARGV[9] legacy: "owner|token" (domain::records::LeaseHolder::legacy), compared
        verbatim with a lease an older lease_acquire.lua stored

Returns:
  {"OK"}    switched: the new layout, status "on_sale", seq + 1
  {"NRS"}   the event is not resharding to that layout (a close set it
            "closed", or another run switched it already): nothing changed
  {"F"}     the caller no longer holds the mover lease with that token (it
            stalled past it; a close or a newer run took it): nothing changed

A compare-and-set on the status and on the lease, in one step with the
switch, so no instance ever sees the new layout without "on_sale" or the old
one after it, a close that wrote "closed" is never undone, and only the run
that drained the old layout under its lease can switch. The caller checks
that the old layout holds no units (its buckets are in other slots).
]]
if redis.call('HGET', KEYS[1], 'status') ~= 'resharding'
  or redis.call('HGET', KEYS[1], 'reshard_to') ~= ARGV[1] .. ':' .. ARGV[2] then
  return {'NRS'}
end
local lease = redis.call('TYPE', KEYS[2])['ok']
local leased = false
if lease == 'hash' then
  local h = redis.call('HMGET', KEYS[2], 'o', 't')
  leased = h[1] == ARGV[4] and h[2] == ARGV[5]
elseif lease == 'string' then
  leased = redis.call('GET', KEYS[2]) == ARGV[9]
end
if not leased then
  return {'F'}
end
-- The layout history: this one appended, the oldest dropped past the cap.
local history = {}
for entry in string.gmatch(redis.call('HGET', KEYS[1], 'history') or '', '[^,]+') do
  history[#history + 1] = entry
end
history[#history + 1] = ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[6] .. ':' .. ARGV[7]
local cap = tonumber(ARGV[8])
local first = math.max(1, #history - cap + 1)
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'buckets', ARGV[2], 'retired', ARGV[3],
  'status', 'on_sale', 'reshard_to', '', 'history', table.concat(history, ',', first))
redis.call('HINCRBY', KEYS[1], 'seq', 1)
return {'OK'}
