--[[ bump_seq.lua — increments an event's seq after units were added to a bucket.

KEYS[1] ss:{e}:meta
Returns {new seq, 1 if the event was marked sold out at the old seq else 0},
or -1 when the event has no meta (nothing is created). The seq invalidates the
sold-out mark; when the mark was current, the caller must also bump every
bucket's epoch, which invalidates their copies of it (set_empty.lua).
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local old = redis.call('HGET', KEYS[1], 'seq')
local mark = redis.call('HGET', KEYS[1], 'soldout') or ''
local marked = string.match(mark, '^(%d+)|') == old
return {redis.call('HINCRBY', KEYS[1], 'seq', 1), marked and 1 or 0}
