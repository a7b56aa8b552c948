--[[ stale_orders.lua — the release orders listed at a home since a bound or
earlier that are not ended: what the release sweeper must end.

KEYS[1] ss:{r#<release>#h<h>}:pend   ZSET request id -> start ms
KEYS[2] ss:{r#<release>#h<h>}:reqs   HASH request id -> home record
ARGV[1] bound (unix ms): entries started at or before it
ARGV[2] count: at most this many entries are looked at

Returns a flat array rid1, record1, rid2, record2, … of the entries whose
record is pending ("P|…"), refused and not released ("R|…") or held ("H|…":
open, or decided with lines to finish; the engine reads its state and
deadline). An entry whose record is none of these (ended meanwhile, or gone) leaves the set here.

One script so that the set and the records are read at one instant.
]]
local out = {}
local rids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, rid in ipairs(rids) do
  local rec = redis.call('HGET', KEYS[2], rid)
  local tag = rec and string.sub(rec, 1, 1)
  if tag == 'P' or tag == 'R' or tag == 'H' then
    out[#out + 1] = rid
    out[#out + 1] = rec
  else
    redis.call('ZREM', KEYS[1], rid)
  end
end
return out
