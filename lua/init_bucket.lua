--[[ init_bucket.lua — creates a bucket with its initial stock, once.

KEYS[1] ss:{e#g#b}:stock   KEYS[2] ss:{e#g#b}:orders (STREAM)
ARGV[1] units   ARGV[2] group: the flusher's consumer group
Returns 1 when created, 0 when the bucket existed (idempotent: resuming an
interrupted creation never resets a bucket that may already have sold). The
order stream and its consumer group are created with the bucket, so the
flusher can read from the first record on.
]]
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[2], '0', 'MKSTREAM')
end
return 1
