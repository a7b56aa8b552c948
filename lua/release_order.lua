--[[ release_order.lua — the last step of a refused release order, at the
user's home, once every line is closed: the reservation back. Also the last
step of a held order cancelled or expired, once every line is given back.

KEYS[1] ss:{r#<release>#h<h>}:units  HASH user -> units counted against the limit
KEYS[2] ss:{r#<release>#h<h>}:reqs   HASH request id -> home record
KEYS[3] ss:{r#<release>#h<h>}:pend   ZSET request ids of orders not ended -> start ms
ARGV[1] rid   ARGV[2] user   ARGV[3] units: the order's units
ARGV[4] expected: the refused record ("R|…"; or "H|…" cancelling or expiring)
ARGV[5] released: the record to put in its place ("X|…"; or "H|…" cancelled
        or expired)

Returns {"OK"} (released: the user's units -= ARGV[3], the record ARGV[5],
the id out of pend), {"R", record} (not the expected record: released
already, or never refused) or {"NR"} (no record).

One script so that the count goes down exactly once, with the record that
says so.
]]
local rec = redis.call('HGET', KEYS[2], ARGV[1])
if not rec then
  return {'NR'}
end
if rec ~= ARGV[4] then
  return {'R', rec}
end
redis.call('HINCRBY', KEYS[1], ARGV[2], -tonumber(ARGV[3]))
redis.call('HSET', KEYS[2], ARGV[1], ARGV[5])
redis.call('ZREM', KEYS[3], ARGV[1])
return {'OK'}
