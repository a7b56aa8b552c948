--[[ counters.lua — the second collect of a sold-out decision: one atomic read.

KEYS[1] ss:{e#g#b}:adds   KEYS[2] ss:{e#g#b}:epoch
Returns {adds, epoch}: how many steps added units to this bucket, and the
bucket's epoch (bumped whenever units come back to a sold-out event).
]]
return {redis.call('GET', KEYS[1]) or '0', redis.call('GET', KEYS[2]) or '0'}
