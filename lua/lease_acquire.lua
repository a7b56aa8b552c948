--[[ lease_acquire.lua — takes or renews an event's mover lease, with a fencing token.
The same script takes the rebalancer's leadership, on ss:{e}:leader and
ss:{e}:term (the number is then a leadership term).

KEYS[1] ss:{e}:lease   STR "owner|token", with a TTL
KEYS[2] ss:{e}:token   STR counter of fencing tokens
ARGV[1] owner (no '|')   ARGV[2] ttl ms   ARGV[3] seize: "seize" (optional)

Returns {"OK", token} when the caller holds the lease (taken now with a fresh
token from INCR, or already its own: TTL renewed, same token), {"HELD", owner}
when another owner holds it. Tokens strictly increase across all owners, so a
bucket that has seen token t can refuse any mover still holding a token < t
(a mover that paused past its lease and woke up — Kleppmann's fencing).

With ARGV[3] = "seize" the caller takes the lease whoever holds it, always with
a fresh token: a close wins over background work (a rebalancer round, a saga's
consolidation, a dead instance's lease that has not expired yet). It must then
raise every bucket's fence to that token before it moves anything, so the
holder it displaced is refused by every bucket.
]]
local cur = redis.call('GET', KEYS[1])
if cur and ARGV[3] ~= 'seize' then
  local owner, token = string.match(cur, '^(.*)|(%d+)$')
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {'OK', token}
  end
  return {'HELD', owner}
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
return {'OK', tostring(token)}
