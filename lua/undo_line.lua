--[[ undo_line.lua — one step of a refused release order's undo of a line, at
one bucket of the line's pool: the walk's ring, walked again.

KEYS[1] ss:{e#g#j}:stock   remaining units of bucket j (existence: "ST")
KEYS[2] ss:{e#g#j}:tk:<rid>:<pass>  the line's marker in j for that pass
KEYS[3] ss:{e#g#j}:orders  STREAM (the void record ARGV[4])
KEYS[4] ss:{e#g#j}:adds    addition count, +1 when units come back
ARGV[1] qty   ARGV[2] taken: the line's take marker "T|oid"
ARGV[3] undone: the line's undone marker "U|oid"
ARGV[4] record: the void record (domain::stream::StreamEntry::data)
ARGV[5] marker lifetime (ms, PX)
ARGV[6] held: "1" for a held order's give-back (cancel, expiry), "0" for a
        refused order's undo

Returns:
  "ST"     bucket j does not exist
  {"OK"}   the take here given back: marker T → U, stock += qty, the void
           record in the stream
  {"CL"}   no decision here yet: the marker is now U, so a late walk of the
           order stops here without taking (closed). A refused order's
           undo only: a held order's give-back (ARGV[6] = "1") answers {"S"}
           and writes nothing, as every line of a held order was taken
           before its commit and its take marker does not expire (take.lua
           ARGV[7]): a bucket without a marker is one its walk passed, whose
           short decision has expired, or the line was given back long ago
           and its U has expired
  {"UD"}   undone already (a replay)
  {"S"}    a short decision (or another order's marker): a walk went on past
           this bucket, the undo goes on too

Atomic so that a walk and the undo racing for this bucket are decided once:
whichever comes first wins, a take is given back at most once (T → U moves
once), and no walk gets past a bucket the undo closed. Works on a sealed
bucket. The markers and the record are the engine's, stored verbatim.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
local kind = redis.call('TYPE', KEYS[2])['ok']
if kind == 'none' then
  if ARGV[6] == '1' then
    return {'S'}
  end
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[5])
  return {'CL'}
end
if kind ~= 'string' then
  return {'S'}
end
local seen = redis.call('GET', KEYS[2])
if seen == ARGV[3] then
  return {'UD'}
end
if seen ~= ARGV[2] then
  return {'S'}
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[5])
redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[4])
redis.call('XADD', KEYS[3], '*', 'd', ARGV[4])
return {'OK'}
