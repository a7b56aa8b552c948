--[[ untake.lua — gives back the units a saga took in a bucket, when the saga
ended otherwise (a concurrent driver of the same request finished first, or
the sweeper ended it).

KEYS[1] ss:{e#g#j}:stock   KEYS[2] ss:{e#g#j}:tk:<rid>:<pass> (the take's marker)
KEYS[3] ss:{e#g#j}:orders  KEYS[4] ss:{e#g#j}:adds  addition count, +1 when units come back
ARGV[1] qty   ARGV[2] taken: the take's marker "T|oid"   ARGV[3] undone: "U|oid"
ARGV[4] record: the void record (domain::stream::StreamEntry::data)
ARGV[5] marker lifetime (ms, PX)

Returns "ST", {"OK"} (marker ARGV[2] became ARGV[3], stock += qty, the void
record in the stream) or {"NO"} (no such take: nothing changed). The
markers and the record are the engine's, compared and stored verbatim.
Atomic and idempotent: the units come back exactly once, together with the
void record that cancels the order record the take wrote.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
if redis.call('TYPE', KEYS[2])['ok'] ~= 'string' or redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return {'NO'}
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[5])
redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[4])
redis.call('XADD', KEYS[3], '*', 'd', ARGV[4])
return {'OK'}
