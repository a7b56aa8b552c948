--[[ init_bucket.lua — creates a bucket with its initial stock, once.

KEYS[1] ss:{e#g#b}:stock   ARGV[1] units
Returns 1 when created, 0 when the bucket existed (idempotent: resuming an
interrupted creation never resets a bucket that may already have sold).
]]
return redis.call('SET', KEYS[1], ARGV[1], 'NX') and 1 or 0
