--[[ reserve_offers.lua — turns units set aside for a draw's waiting line into
tickets, each to be offered to the next position in line.

KEYS[1] ss:{e#g#b}:stock   missing = no such bucket
KEYS[2] ss:{e#g#b}:sealed  a sealed bucket answers "ST" (closed: its list is leftover)
KEYS[3] ss:{e#g#b}:wl      HASH aside, seq, t:<ticket> -> ticket record
KEYS[4] ss:{e#g#b}:wo      ZSET ticket -> -1 (reserved) or the offer's deadline ms
ARGV[1] max: tickets made, and answered, at most
ARGV[2] reserved: the reserved record (domain::offer::Ticket), stored as given

Returns "ST", or {"OK", ticket, …}: the bucket's reserved tickets (the ones
made now and any an earlier sweeper left without an offer), at most max.
Atomic so a unit aside becomes one ticket, once: aside drops by the tickets
made (units, aside + reserved + offered, is unchanged).
]]
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 1 then
  return 'ST'
end
local max = tonumber(ARGV[1])
local aside = tonumber(redis.call('HGET', KEYS[3], 'aside') or '0')
local n = math.min(aside, max)
for _ = 1, n do
  local t = redis.call('HINCRBY', KEYS[3], 'seq', 1)
  redis.call('HSET', KEYS[3], 't:' .. t, ARGV[2])
  redis.call('ZADD', KEYS[4], -1, t)
end
if n > 0 then
  redis.call('HINCRBY', KEYS[3], 'aside', -n)
end
local out = {'OK'}
for _, t in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], -1, -1, 'LIMIT', 0, max)) do
  out[#out + 1] = t
end
return out
