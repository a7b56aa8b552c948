--[[ retire.lua — records a sealed bucket's leftover units for the database.

KEYS[1] ss:{e#g#b}:stock   KEYS[2] ss:{e#g#b}:sealed   KEYS[3] ss:{e#g#b}:orders
ARGV[1] now   ARGV[2] b   ARGV[3] id: the record id for the leftover ("<event>#<gen>#<b>")

Returns "ST" (no bucket), {"NS"} (not sealed: nothing changed) or {"OK", units}:
the stock is moved, in one step, into a leftover record ("l|…") in the bucket's
stream, which the flusher writes to the database. Running it again finds
stock 0 and writes nothing, so the leftover is recorded exactly once.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return {'NS'}
end
local units = redis.call('GET', KEYS[1])
if tonumber(units) > 0 then
  redis.call('SET', KEYS[1], '0')
  redis.call('XADD', KEYS[3], '*', 'd', 'l|' .. ARGV[3] .. '||' .. units .. '|' ..
    ARGV[2] .. '|' .. ARGV[2] .. '||' .. ARGV[1])
end
return {'OK', units}
