--[[ open_offer.lua — opens a reserved ticket's offer at the position the list
gave it, or, nobody being left in line, puts its unit back on open sale.

KEYS[1] ss:{e#g#b}:stock   remaining units (a unit nobody in line wants comes back here)
KEYS[2] ss:{e#g#b}:sealed  a sealed bucket answers "ST"
KEYS[3] ss:{e#g#b}:wl      HASH on, aside, units, t:<ticket> -> ticket record
KEYS[4] ss:{e#g#b}:wo      ZSET ticket -> -1 (reserved) or the offer's deadline ms
KEYS[5] ss:{e#g#b}:adds    addition count, +1 when units go back on sale
ARGV[1] ticket
ARGV[2] reserved: the reserved record, compared
ARGV[3] record: the open offer's record "o|pos|user|deadline", or the to-sale
        record (domain::offer::Ticket), stored as given
ARGV[4] deadline: the offer's deadline ms, or "" with the to-sale record

Returns "ST", {"AL"} (the ticket is not reserved: opened or closed before,
nothing changed), {"OK"} (the offer is open: record stored, its deadline in
wo) or {"SL"} (to sale: the ticket's unit and every unit aside back in stock,
units down by them, on = "0": units that come back later go to stock too).
Atomic so a ticket opens once, and its unit is in units or in stock, never
both.
]]
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 1 then
  return 'ST'
end
local field = 't:' .. ARGV[1]
if redis.call('HGET', KEYS[3], field) ~= ARGV[2] then
  return {'AL'}
end
redis.call('HSET', KEYS[3], field, ARGV[3])
if ARGV[4] ~= '' then
  redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
  return {'OK'}
end
redis.call('ZREM', KEYS[4], ARGV[1])
local back = 1 + tonumber(redis.call('HGET', KEYS[3], 'aside') or '0')
redis.call('HSET', KEYS[3], 'aside', 0, 'on', '0')
redis.call('HINCRBY', KEYS[3], 'units', -back)
redis.call('INCRBY', KEYS[1], back)
redis.call('INCR', KEYS[5])
return {'SL'}
