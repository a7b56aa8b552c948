--[[ take.lua — one probe of the ring by the purchase saga (the slow path).

KEYS[1] ss:{e#g#j}:stock   remaining units of bucket j
KEYS[2] ss:{e#g#j}:tk:<rid>:<pass>  this step's marker (its own key: no request
                           or user id can collide with it): STR "T|oid" / "U|oid",
                           or HASH a (available), n (adds) for a short decision
KEYS[3] ss:{e#g#j}:orders  STREAM of order records (d = the record ARGV[4])
KEYS[4] ss:{e#g#j}:xfer    HASH transfers out of j: xid -> "target|units|token|o or d"
KEYS[5] ss:{e#g#j}:adds    count of steps that added units to j (cancel, IN, untake)
KEYS[6] ss:{e#g#j}:sealed  exists once the bucket is sealed
ARGV[1] qty   ARGV[2] order id
ARGV[3] taken: the marker of this take, "T|oid" (domain::records::ProbeMarker)
ARGV[4] record: the order record (domain::stream::StreamEntry::data), stored as
        the stream entry's field d
ARGV[5] marker lifetime (ms, PX)
ARGV[6] undone: a release line's take only, its undone marker "U|oid"; absent
        for an event's own saga, whose take behaves exactly as without it
ARGV[7] kept: a release line's take only: "1" for a held order's line, whose
        take marker is written without a lifetime (its confirm K or give-back
        U gives it one; a short decision keeps ARGV[5]), "0" otherwise
ARGV[8] confirmed: a release line's take only, its confirmed marker "K|oid"

Returns:
  "ST"                          bucket j does not exist or is sealed
  {"T", oid}                    q units taken here for order oid (now, or by an
                                earlier driver of this saga)
  {"U"}                         (a line's take, ARGV[6] given) the marker is the
                                line's undone one: the order was refused and
                                its undo came first here; the walk stops
  {"K"}                         (a line's take, ARGV[8] given) the marker is the
                                line's confirmed one: its take here stands,
                                confirmed; the walk stops (a late walk that
                                went on would take a second time further on)
  {"S", available, fresh, adds} fewer than q here. available = stock + units
                                journaled out; adds = j's addition count when
                                that was decided; fresh = 1 when decided by this
                                call, 0 when an earlier driver's decision is replayed

Records: every one is the engine's (ARGV[3], ARGV[4]), stored verbatim; the
two numbers of a short decision are only known here, so they are the
marker's own hash fields, never spliced into a string.

Each bucket decides once per (rid, pass) and remembers the decision in its
marker, so a saga re-driven after a crash (or driven twice at once by a
retry) walks the ring to the same bucket and never takes twice. A replayed
"S" is as good as a fresh one for a sold-out answer: the engine compares its
adds with a second collect, which tells whether units arrived since the
decision. A marker "U|oid" (take undone), or "T|oid" of another order (a saga
of the same request id that was aborted; its driver gives those units back),
answers with the bucket as it is now, and takes nothing. A string
"S|available|adds" is a short decision written before they were hashes. The
take and its order record are one step, so no unit leaves a bucket
unrecorded. Markers expire after ARGV[5] ms; the saga's end deletes them
sooner (clear_markers.lua), except a take that stands. A held release
line's take (ARGV[7] = "1") does not expire: it must stand until its order
is confirmed or given back, however late that comes, and only those steps
(confirm_line.lua, undo_line.lua) replace it, with a lifetime.
]]
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[6]) == 1 then
  return 'ST'
end
local seen = false
local marker = redis.call('TYPE', KEYS[2])['ok']
if marker == 'hash' then
  local short = redis.call('HMGET', KEYS[2], 'a', 'n')
  return {'S', short[1], 0, short[2]}
elseif marker == 'string' then
  seen = redis.call('GET', KEYS[2])
  if seen == ARGV[3] then return {'T', ARGV[2]} end
  if ARGV[6] and seen == ARGV[6] then return {'U'} end
  if ARGV[8] and seen == ARGV[8] then return {'K'} end
  local was, adds = string.match(seen, '^S|([^|]*)|(.*)$')
  if was then return {'S', was, 0, adds} end
end
local adds = redis.call('GET', KEYS[5]) or '0'
local qty = tonumber(ARGV[1])
local stock = tonumber(redis.call('GET', KEYS[1]))
if stock >= qty and not seen then
  redis.call('DECRBY', KEYS[1], qty)
  redis.call('XADD', KEYS[3], '*', 'd', ARGV[4])
  if ARGV[7] == '1' then
    redis.call('SET', KEYS[2], ARGV[3])
  else
    redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[5])
  end
  return {'T', ARGV[2]}
end
local transit = 0
for _, v in ipairs(redis.call('HVALS', KEYS[4])) do
  local units, state = string.match(v, '^[^|]*|([^|]*)|[^|]*|(%a)$')
  if state == 'o' then transit = transit + tonumber(units) end
end
local available = string.format('%d', stock + transit)
if seen then
  -- "U|oid" or "K|oid" of an event's saga (never written), or another
  -- order's take: report the bucket as it is.
  return {'S', available, 0, adds}
end
redis.call('HSET', KEYS[2], 'a', available, 'n', adds)
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {'S', available, 1, adds}
