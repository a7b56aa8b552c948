--[[ reserve.lua — the first step of a release order, at the user's home:
answer a known request id, or count the order against the release-wide limit.

KEYS[1] ss:{r#<release>#h<h>}:units  HASH user -> units counted against the limit
KEYS[2] ss:{r#<release>#h<h>}:reqs   HASH request id -> home record
KEYS[3] ss:{r#<release>#h<h>}:pend   ZSET request ids of orders not ended -> start ms
ARGV[1] rid   ARGV[2] user   ARGV[3] units: the order's units, all lines
ARGV[4] limit: the release-wide per-user limit, 0 for none
ARGV[5] now: unix ms (the pend score)
ARGV[6] pending: the order's pending record (domain::release::HomeRecord, "P|…")
ARGV[7] limited: the record kept when the limit refuses ("L|…")

Returns:
  {"OK"}               counted: the user's units += units, the pending
                       record stored and the id in pend
  {"L", held}          over the limit: nothing counted, ARGV[7] kept
  {"R", record, held}  the request id has a record (held: the user's units now)

One script so that the count and the record change together: no order is
taken before its units are counted, and a count is never made twice for
one request id.
]]
local rec = redis.call('HGET', KEYS[2], ARGV[1])
if rec then
  return {'R', rec, redis.call('HGET', KEYS[1], ARGV[2]) or '0'}
end
local held = tonumber(redis.call('HGET', KEYS[1], ARGV[2]) or '0')
local units, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
if limit > 0 and held + units > limit then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[7])
  return {'L', held}
end
redis.call('HINCRBY', KEYS[1], ARGV[2], units)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
return {'OK'}
