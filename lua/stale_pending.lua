--[[ stale_pending.lua — the sagas pending at a home bucket since a bound or
earlier: what the sweeper must drive to an end.

KEYS[1] ss:{e#g#h}:pend   ZSET request id -> start ms (written by purchase.lua
                          with the pending record, removed by finish.lua)
KEYS[2] ss:{e#g#h}:reqs   HASH request id -> record
ARGV[1] bound (unix ms): entries started at or before it
ARGV[2] count: at most this many entries are looked at

Returns a flat array rid1, record1, rid2, record2, … of the entries whose
record is still pending ("P|q|oid|user|t"). An entry whose record is no longer
pending (ended meanwhile, or gone) is removed from the set here.

One script so that the set and the records are read at one instant; works on
sealed buckets (a close or reshard settles those, the sweeper may too).
]]
local out = {}
local rids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, rid in ipairs(rids) do
  local rec = redis.call('HGET', KEYS[2], rid)
  if rec and string.sub(rec, 1, 1) == 'P' then
    out[#out + 1] = rid
    out[#out + 1] = rec
  else
    redis.call('ZREM', KEYS[1], rid)
  end
end
return out
