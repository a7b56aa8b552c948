--[[ bump_seq.lua — increments an event's seq after units were added to a bucket.

KEYS[1] ss:{e}:meta
Returns the new seq, or -1 when the event has no meta (nothing is created).
The seq lets a sold-out decision check that no units were added anywhere while
it probed the ring (and invalidates the sold-out mark).
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
return redis.call('HINCRBY', KEYS[1], 'seq', 1)
