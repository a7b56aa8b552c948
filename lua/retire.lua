--[[ retire.lua — records a sealed bucket's leftover units for the database.

KEYS[1] ss:{e#g#b}:stock   KEYS[2] ss:{e#g#b}:sealed   KEYS[3] ss:{e#g#b}:orders
KEYS[4] ss:{e#g#b}:wl      HASH the bucket's waiting list: its units (aside,
                           reserved or offered, none bought) are leftover too
ARGV[1] record: the leftover record with qty 0 (domain::stream::StreamEntry::data,
        id "<event>#<gen>#<b>")

Returns "ST" (no bucket), {"NS"} (not sealed: nothing changed) or {"OK", units}:
the stock is moved, in one step, into a leftover record in the bucket's
stream, which the flusher writes to the database: field d the engine's
record as given, field q the units (only this script knows them; the
decoder takes them as the record's qty). Running it again finds
stock 0 and writes nothing, so the leftover is recorded exactly once.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return {'NS'}
end
-- Units stay strings as stored: Lua's tostring of a number past 1e14 is
-- "6.4e+15", which no reader parses; a sum is formatted as an integer.
local units = redis.call('GET', KEYS[1])
local waiting = tonumber(redis.call('HGET', KEYS[4], 'units') or '0')
if waiting > 0 then
  units = string.format('%d', tonumber(units) + waiting)
  redis.call('HSET', KEYS[4], 'units', 0, 'aside', 0)
end
if tonumber(units) > 0 then
  redis.call('SET', KEYS[1], '0')
  redis.call('XADD', KEYS[3], '*', 'd', ARGV[1], 'q', units)
end
return {'OK', units}
