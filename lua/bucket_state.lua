--[[ bucket_state.lua — one consistent read of a bucket.

KEYS[1] ss:{e#g#b}:stock   KEYS[2] ss:{e#g#b}:xfer   KEYS[3] ss:{e#g#b}:fence
KEYS[4] ss:{e#g#b}:adds    KEYS[5] ss:{e#g#b}:demand  KEYS[6] ss:{e#g#b}:hunits
KEYS[7] ss:{e#g#b}:sealed  KEYS[8] ss:{e#g#b}:wl
Returns "ST" when the bucket does not exist, else {stock, units journaled out by
open transfers, highest fencing token accepted, addition count, units asked
for by buyers homed here, units in live holds of users homed here, 1 when
sealed else 0, units of a draw's waiting list here (aside or offered)}: one atomic read, so they belong to the same instant. A sealed
bucket is still read (a reshard reads the stock it moves out); the engine's
view takes it as a sign to check that its cached layout is still current.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
local transit = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
  local units, state = string.match(v, '^[^|]*|([^|]*)|[^|]*|(%a)$')
  if state == 'o' then transit = transit + tonumber(units) end
end
return {redis.call('GET', KEYS[1]), string.format('%d', transit),
  redis.call('GET', KEYS[3]) or '0', redis.call('GET', KEYS[4]) or '0',
  redis.call('GET', KEYS[5]) or '0', redis.call('GET', KEYS[6]) or '0',
  redis.call('EXISTS', KEYS[7]), redis.call('HGET', KEYS[8], 'units') or '0'}
