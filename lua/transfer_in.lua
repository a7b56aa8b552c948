--[[ transfer_in.lua — IN: adds a journaled transfer's units to the target bucket, once.

KEYS[1] ss:{e#g#b}:stock   KEYS[2] ss:{e#g#b}:xin   KEYS[3] ss:{e#g#b}:fence
KEYS[4] ss:{e#g#b}:adds    addition count, +1 when applied
KEYS[5] sealed flag: a sealed bucket answers "ST" (no transfer in or out)
ARGV[1] token: fencing token   ARGV[2] xid: transfer id   ARGV[3] units
ARGV[4] entry: "source|units" (domain::transfer::InEntry), stored as given
ARGV[5] sealed_ok: '1' when allowed on a sealed bucket: the IN of a transfer
        whose OUT applied (`mover::complete`: a mover's own, or one a takeover
        finishes). Its units left their source's stock already; a target
        sealed since the OUT must still take them, or they stay in the journal
        for good, and a reshard or close that seals and then completes could
        never finish. The run that sealed the layout moves them on (a reshard)
        or counts them (a close).

Returns "ST" (no bucket), {"F", highest} (stale mover, nothing changed),
{"D", units} (this transfer id was applied before: nothing changed) or
{"A", units} (stock += units, xid remembered in xin, adds + 1).
Idempotent per transfer id, so a new leader can finish a transfer a crashed
one left half-done without ever adding its units twice.
]]
if redis.call('EXISTS', KEYS[1]) == 0 or (ARGV[5] ~= '1' and redis.call('EXISTS', KEYS[5]) == 1) then
  return 'ST'
end
local token = tonumber(ARGV[1])
local fence = tonumber(redis.call('GET', KEYS[3]) or '0')
if token < fence then
  return {'F', string.format('%d', fence)}
end
if token > fence then
  redis.call('SET', KEYS[3], ARGV[1])
end
local seen = redis.call('HGET', KEYS[2], ARGV[2])
if seen then
  return {'D', string.match(seen, '^[^|]*|(.*)$')}
end
redis.call('INCRBY', KEYS[1], ARGV[3])
redis.call('INCR', KEYS[4])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
return {'A', ARGV[3]}
