--[[ untake.lua — gives back the units a saga took in a bucket, when the saga
ended otherwise (a concurrent driver of the same request finished first, or
the sweeper ended it).

KEYS[1] ss:{e#g#j}:stock   KEYS[2] ss:{e#g#j}:tk:<rid>:<pass> (the take's marker)
KEYS[3] ss:{e#g#j}:orders  KEYS[4] ss:{e#g#j}:adds  addition count, +1 when units come back
ARGV[1] now  ARGV[2] j  ARGV[3] rid  ARGV[4] pass  ARGV[5] user  ARGV[6] qty
ARGV[7] order id  ARGV[8] home bucket  ARGV[9] marker lifetime (ms, PX)

Returns "ST", {"OK"} (marker "T|oid" became "U|oid", stock += qty, a void
record "v|…" in the stream) or {"NO"} (no such take: nothing changed).
Atomic and idempotent: the units come back exactly once, together with the
void record that cancels the order record the take wrote.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
if redis.call('GET', KEYS[2]) ~= 'T|' .. ARGV[7] then
  return {'NO'}
end
redis.call('SET', KEYS[2], 'U|' .. ARGV[7], 'PX', ARGV[9])
redis.call('INCRBY', KEYS[1], ARGV[6])
redis.call('INCR', KEYS[4])
redis.call('XADD', KEYS[3], '*', 'd', 'v|' .. ARGV[7] .. '|' .. ARGV[5] .. '|' .. ARGV[6] .. '|' ..
  ARGV[2] .. '|' .. ARGV[8] .. '|' .. ARGV[3] .. '|' .. ARGV[1])
return {'OK'}
