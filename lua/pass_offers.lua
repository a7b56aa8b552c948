--[[ pass_offers.lua — passes open offers of a draw's waiting list whose
deadline came: each unit back aside, for the next position in line.

KEYS[1] ss:{e#g#b}:stock   missing = no such bucket
KEYS[2] ss:{e#g#b}:sealed  a sealed bucket answers "ST"
KEYS[3] ss:{e#g#b}:wl      HASH aside, t:<ticket> -> ticket record
KEYS[4] ss:{e#g#b}:wo      ZSET ticket -> -1 (reserved) or the offer's deadline ms
ARGV[1] now ms   ARGV[2] count: offers passed at most
ARGV[3] passed: the passed state (domain::offer::Ticket::PASSED_TAG), put in
        place of the open record's first field

Returns "ST", or {"OK", record, …}: the passed records of the offers passed
now. Per offer, in this one step: out of wo, its record passed, aside + 1
(units unchanged). An offer is passed once: the record is compared open
first, and a claim racing the sweeper finds it passed, or the sweeper finds
it taken.
]]
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 1 then
  return 'ST'
end
local out = {'OK'}
for _, t in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], 0, ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))) do
  redis.call('ZREM', KEYS[4], t)
  local field = 't:' .. t
  local record = redis.call('HGET', KEYS[3], field)
  if record and string.sub(record, 1, 1) == 'o' then
    local passed = ARGV[3] .. string.sub(record, 2)
    redis.call('HSET', KEYS[3], field, passed)
    redis.call('HINCRBY', KEYS[3], 'aside', 1)
    out[#out + 1] = passed
  end
end
return out
