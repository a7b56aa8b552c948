--[[ bump_seq.lua — increments an event's seq after units were added to a bucket.

KEYS[1] ss:{e}:meta
Returns {new seq, due}, or -1 when the event has no meta (nothing is created).
The seq invalidates the meta's sold-out mark. When that mark was current, the
buckets' copies of it (set_empty.lua) must be invalidated too, by bumping every
bucket's epoch: the script then records "epochs_due" = the new seq, and `due`
is the recorded value (0 when nothing is due). The field stays until the
caller reports every epoch bumped (epochs_bumped.lua with the same value), so a
caller that failed or died in between leaves the work for the next one: the
next bump_seq (any later cancel, untake or transfer, or a retried cancel)
answers the same `due` and bumps the epochs again.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local old = redis.call('HGET', KEYS[1], 'seq')
local mark = redis.call('HGET', KEYS[1], 'soldout') or ''
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
if string.match(mark, '^(%d+)|') == old then
  redis.call('HSET', KEYS[1], 'epochs_due', seq)
  return {seq, seq}
end
return {seq, tonumber(redis.call('HGET', KEYS[1], 'epochs_due') or '0')}
