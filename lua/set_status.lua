--[[ set_status.lua — compare-and-set of an event's status.

KEYS[1] ss:{e}:meta   ARGV[1] from: the expected status   ARGV[2] to: the new status
Returns 1 when the status was ARGV[1] and is now ARGV[2], else 0.
A CAS so that two instances finishing the same creation (or close) agree.
]]
if redis.call('HGET', KEYS[1], 'status') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
return 1
