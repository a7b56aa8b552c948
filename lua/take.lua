--[[ take.lua — one probe of the ring by the purchase saga (the slow path).

KEYS[1] ss:{e#g#j}:stock   remaining units of bucket j
KEYS[2] ss:{e#g#j}:tk:<rid>:<pass>  STR this step's marker (its own key: no
                           request or user id can collide with it)
KEYS[3] ss:{e#g#j}:orders  STREAM of order records (d = "o|oid|user|q|b|h|rid|t")
KEYS[4] ss:{e#g#j}:xfer    HASH transfers out of j: xid -> "target|units|token|o or d"
KEYS[5] ss:{e#g#j}:adds    count of steps that added units to j (cancel, IN, untake)
KEYS[6] ss:{e#g#j}:sealed  exists once the bucket is sealed
ARGV[1] now (unix ms)   ARGV[2] j   ARGV[3] rid   ARGV[4] pass
ARGV[5] user            ARGV[6] qty  ARGV[7] order id   ARGV[8] home bucket
ARGV[9] marker lifetime (ms, PX)

Returns:
  "ST"                          bucket j does not exist or is sealed
  {"T", oid}                    q units taken here for order oid (now, or by an
                                earlier driver of this saga)
  {"S", available, fresh, adds} fewer than q here. available = stock + units
                                journaled out; adds = j's addition count when
                                that was decided; fresh = 1 when decided by this
                                call, 0 when an earlier driver's decision is replayed

Each bucket decides once per (rid, pass) and remembers the decision in its
marker ("T|oid" or "S|available|adds"), so a saga re-driven after a crash (or
driven twice at once by a retry) walks the ring to the same bucket and never
takes twice. A replayed "S" is as good as a fresh one for a sold-out answer:
the engine compares its adds with a second collect, which tells whether units
arrived since the decision. A marker "U|oid" (take undone), or "T|oid" of
another order (a saga of the same request id that was aborted; its driver
gives those units back), answers with the bucket as it is now, and takes
nothing. The take and its order record are one step, so no unit leaves a
bucket unrecorded. Markers expire after ARGV[9] ms; the saga's end deletes
them sooner (clear_markers.lua), except a take that stands.
]]
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[6]) == 1 then
  return 'ST'
end
local seen = redis.call('GET', KEYS[2])
if seen then
  local kind, value, adds = string.match(seen, '^(%a)|([^|]*)|?(.*)$')
  if kind == 'T' and value == ARGV[7] then return {'T', value} end
  if kind == 'S' then return {'S', value, 0, adds} end
end
local adds = redis.call('GET', KEYS[5]) or '0'
local qty = tonumber(ARGV[6])
local stock = tonumber(redis.call('GET', KEYS[1]))
if stock >= qty and not seen then
  redis.call('DECRBY', KEYS[1], qty)
  redis.call('XADD', KEYS[3], '*', 'd', 'o|' .. ARGV[7] .. '|' .. ARGV[5] .. '|' .. qty .. '|' ..
    ARGV[2] .. '|' .. ARGV[8] .. '|' .. ARGV[3] .. '|' .. ARGV[1])
  redis.call('SET', KEYS[2], 'T|' .. ARGV[7], 'PX', ARGV[9])
  return {'T', ARGV[7]}
end
local transit = 0
for _, v in ipairs(redis.call('HVALS', KEYS[4])) do
  local units, state = string.match(v, '^[^|]*|([^|]*)|[^|]*|(%a)$')
  if state == 'o' then transit = transit + tonumber(units) end
end
local available = string.format('%d', stock + transit)
if seen then
  -- "U|oid" (undone) or another order's take: report the bucket as it is.
  return {'S', available, 0, adds}
end
redis.call('SET', KEYS[2], 'S|' .. available .. '|' .. adds, 'PX', ARGV[9])
return {'S', available, 1, adds}
