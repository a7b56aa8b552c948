--[[ claim_offer.lua — buys an open offer of a draw's waiting list: the offer
is checked, taken and its order written in this one step.

KEYS[1] ss:{e#g#b}:stock   missing = no such bucket
KEYS[2] ss:{e#g#b}:sealed  a sealed bucket refuses ("CL": the sale is closed)
KEYS[3] ss:{e#g#b}:wl      HASH units, t:<ticket> -> ticket record
KEYS[4] ss:{e#g#b}:wo      ZSET ticket -> the offer's deadline ms
KEYS[5] ss:{e#g#b}:idx     HASH order id -> order entry
KEYS[6] ss:{e#g#b}:orders  STREAM (the order's record: its order id -> its entry,
                           as purchase.lua writes one)
ARGV[1] ticket
ARGV[2] open: the open offer's record the buyer's token names, compared
ARGV[3] passed: that offer's passed record, compared
ARGV[4] now ms   ARGV[5] deadline: the offer's deadline ms
ARGV[6] order: the order id
ARGV[7] entry: its index entry "C|user|1|b||now" (domain::model::OrderEntry)
ARGV[8] taken: the taken record "t|pos|user|deadline|order", stored as given
ARGV[9] ends: the end of the event's sale window (ends_at) ms, "" without one

Returns "ST" (no bucket), {"CL"} (sealed), {"R", record} (taken before: the
record names its order), {"EN"} (now >= ends: the sale window ended, nothing
bought, as a purchase then buys nothing), {"PA"} (passed), {"NO"} (the ticket holds no such
offer), {"EX"} (now >= deadline: not bought; the sweeper passes it) or
{"OK"} (bought: entry in idx, the order's record in the stream, the ticket
taken and out of wo, units - 1). Atomic so the offer is consumed with its
order, once: a retry finds the taken record and answers its order, also
after the close or the window's end (the taken record is read before the
seal and the end: a buyer whose reply was lost is told the order it has,
as a purchase's retry is).
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
local field = 't:' .. ARGV[1]
local record = redis.call('HGET', KEYS[3], field)
if record and string.sub(record, 1, 1) == 't' then
  return {'R', record}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'CL'}
end
if ARGV[9] ~= '' and tonumber(ARGV[4]) >= tonumber(ARGV[9]) then
  return {'EN'}
end
if record and record == ARGV[3] then
  return {'PA'}
end
if record ~= ARGV[2] then
  return {'NO'}
end
if tonumber(ARGV[4]) >= tonumber(ARGV[5]) then
  return {'EX'}
end
redis.call('HSET', KEYS[5], ARGV[6], ARGV[7])
redis.call('XADD', KEYS[6], '*', ARGV[6], ARGV[7])
redis.call('HSET', KEYS[3], field, ARGV[8])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HINCRBY', KEYS[3], 'units', -1)
return {'OK'}
