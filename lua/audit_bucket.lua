--[[ audit_bucket.lua — one atomic read of everything the conservation audit needs
from a bucket.

KEYS[1] stock  KEYS[2] xfer  KEYS[3] xin  KEYS[4] adds  KEYS[5] orders  KEYS[6] sealed
KEYS[7] hunits (units in live holds of users homed here)
KEYS[8] wl (a draw's waiting list here: its units, aside or offered, are
        unsold units of the bucket, counted with the stock)
(all ss:{e#g#b}:…)
ARGV[1] page: at most this many stream records in the reply

Returns "ST" (no bucket) or
{stock, adds, sealed (0/1), last generated stream id ('0-0' if none),
 {xid, target, units, …} open transfers out of b,
 {xid, …} transfers applied into b,
 {id, kind, qty, …} the first ARGV[1] entries still in the stream (not yet flushed;
   a purchase call's entry of many orders is one, kind o, qty their sum; the
   shapes are domain::stream's: d [q], k o h, or order fields),
 the server's clock at the read, in ms,
 units in live holds}
Atomic so that a purchase, cancel or take (which change the stock and the
stream together) is either wholly seen or not at all. A full page means more
records may follow: the caller reads them with XRANGE COUNT from the last id
it got up to the last generated id (records after it are newer than this
read; records deleted meanwhile were flushed, and the ledger counts them up
to that id), so one call never walks a whole stream that a database outage
let grow, and Redis is never blocked for long.
The clock tells records written after this read (their ids are at or after
it) from records the ledger has that this stream never generated, older than
the read: writes Redis lost (a restart from an AOF missing its last second, a
failover to a replica that missed them), which the audit must count.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
local open = {}
local xfer = redis.call('HGETALL', KEYS[2])
for i = 1, #xfer, 2 do
  local target, units, state = string.match(xfer[i + 1], '^([^|]*)|([^|]*)|[^|]*|(%a)$')
  if state == 'o' then
    open[#open + 1] = xfer[i]
    open[#open + 1] = target
    open[#open + 1] = units
  end
end
local applied = redis.call('HKEYS', KEYS[3])
local records = {}
local last = '0-0'
if redis.call('EXISTS', KEYS[5]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[5])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1] end
  end
  for _, entry in ipairs(redis.call('XRANGE', KEYS[5], '-', '+', 'COUNT', tonumber(ARGV[1]))) do
    local f = entry[2]
    local kind, qty
    if f[1] == 'd' then
      kind, qty = string.match(f[2] or '', '^(%a)|[^|]*|[^|]*|([^|]*)|')
      -- The units a step counted itself (a leftover): their own field.
      if f[3] == 'q' then qty = f[4] end
    elseif f[1] == 'k' then
      -- A copy record: kind in the head, qty in the index entry it copies.
      kind = string.match(f[2] or '', '^(%a)|')
      qty = string.match(f[6] or '', '^%a|[^|]*|(%d+)|')
    else
      -- A purchase call's orders: order id -> index entry "S|user|qty|…".
      kind, qty = 'o', 0
      for i = 2, #f, 2 do
        qty = qty + (tonumber(string.match(f[i], '^%a|[^|]*|(%d+)|')) or 0)
      end
      qty = tostring(qty)
    end
    -- Never a nil in the table (it would shift every later record).
    records[#records + 1] = entry[1]
    records[#records + 1] = kind or '?'
    records[#records + 1] = qty or '0'
  end
end
local now = redis.call('TIME')
-- The stock stays the string stored (Lua's tostring of a number past 1e14
-- is "6.4e+15"); with units waiting, their sum formatted as an integer.
local stock = redis.call('GET', KEYS[1])
local waiting = tonumber(redis.call('HGET', KEYS[8], 'units') or '0')
if waiting > 0 then
  stock = string.format('%d', tonumber(stock) + waiting)
end
return {stock, redis.call('GET', KEYS[4]) or '0',
  redis.call('EXISTS', KEYS[6]), last, open, applied, records,
  string.format('%d', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)),
  redis.call('GET', KEYS[7]) or '0'}
