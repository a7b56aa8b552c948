--[[ confirm_line.lua — one step of a held release order's line confirmed, at
one bucket of the line's pool: the walk's ring, walked again.

KEYS[1] ss:{e#g#j}:stock   remaining units of bucket j (existence: "ST")
KEYS[2] ss:{e#g#j}:tk:<rid>:<pass>  the line's marker in j for that pass
KEYS[3] ss:{e#g#j}:orders  STREAM (the confirm record ARGV[3])
ARGV[1] taken: the line's take marker "T|oid"
ARGV[2] confirmed: the line's confirmed marker "K|oid"
ARGV[3] record: the confirm record (domain::stream::StreamEntry::data)
ARGV[4] marker lifetime (ms, PX)

Returns:
  "ST"     bucket j does not exist
  {"OK"}   the take here confirmed: marker T → K, the confirm record in the
           stream
  {"AK"}   confirmed already (a replay)
  {"S"}    a short decision (or another order's marker): the walk went on
           past this bucket, the confirm goes on too
  {"NO"}   no marker here, or the line's undone one: the take is not here.
           The take marker of a held order's line does not expire (take.lua
           ARGV[7]), so no marker is a bucket its walk passed (a short
           decision since expired) or a confirm whose K has expired: the
           engine walks on, and a line whose walk finds no marker at all
           was confirmed before

Atomic so that the confirm record is written exactly once (T → K moves
once) however many drivers finish the order. Moves no units. Works on a
sealed bucket (a close decides held orders after sealing). The markers and
the record are the engine's, stored verbatim.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
local kind = redis.call('TYPE', KEYS[2])['ok']
if kind == 'none' then
  return {'NO'}
end
if kind ~= 'string' then
  return {'S'}
end
local seen = redis.call('GET', KEYS[2])
if seen == ARGV[2] then
  return {'AK'}
end
if seen ~= ARGV[1] then
  if string.sub(seen, 1, 2) == 'U|' and string.sub(seen, 3) == string.sub(ARGV[1], 3) then
    return {'NO'}
  end
  return {'S'}
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4])
redis.call('XADD', KEYS[3], '*', 'd', ARGV[3])
return {'OK'}
