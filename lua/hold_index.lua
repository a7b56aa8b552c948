--[[ hold_index.lua — moves a bucket's entry in the deadline index ss:holds
after a sweep of that bucket.

KEYS[1] ss:holds   ZSET bucket "<event>#<gen>#<b>" -> when to sweep it next (ms)
ARGV[1] bucket: its name   ARGV[2] seen: the score the sweeper read before sweeping
ARGV[3] next: the bucket's earliest pay-by left ('' = no hold left: drop the entry)

Returns 1 when the entry was moved or dropped, 0 when its score changed since
the sweeper read it (a purchase announced a new first hold meanwhile: its
lower score stands). Compare-and-set, so a sweeper never raises or drops an
entry a purchase has just lowered; a sweeper that dropped the entry reads
the bucket once more and announces what it finds (a first hold whose
announcement came before the drop).
]]
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
