--[[ untake.lua — gives back the units a saga took in a bucket, when the saga
ended otherwise (a concurrent driver of the same request finished first).

KEYS[1] ss:{e#g#j}:stock   KEYS[2] ss:{e#g#j}:reqs   KEYS[3] ss:{e#g#j}:orders
KEYS[4] ss:{e#g#j}:adds    addition count, +1 when units come back
ARGV[1] now  ARGV[2] j  ARGV[3] rid  ARGV[4] pass  ARGV[5] user  ARGV[6] qty
ARGV[7] order id  ARGV[8] home bucket

Returns "ST", {"OK"} (marker "T|oid" became "U|oid", stock += qty, a void
record "k=v" in the stream) or {"NO"} (no such take: nothing changed).
Atomic and idempotent: the units come back exactly once, together with the
void record that cancels the order record the take wrote.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
local marker = 't:' .. ARGV[3] .. ':' .. ARGV[4]
if redis.call('HGET', KEYS[2], marker) ~= 'T|' .. ARGV[7] then
  return {'NO'}
end
redis.call('HSET', KEYS[2], marker, 'U|' .. ARGV[7])
redis.call('INCRBY', KEYS[1], ARGV[6])
redis.call('INCR', KEYS[4])
redis.call('XADD', KEYS[3], '*', 'd', 'v|' .. ARGV[7] .. '|' .. ARGV[5] .. '|' .. ARGV[6] .. '|' ..
  ARGV[2] .. '|' .. ARGV[8] .. '|' .. ARGV[3] .. '|' .. ARGV[1])
return {'OK'}
