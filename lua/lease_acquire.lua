--[[ lease_acquire.lua — takes or renews an event's mover lease, with a fencing token.
The same script takes the rebalancer's leadership, on ss:{e}:leader and
ss:{e}:term (the number is then a leadership term).

KEYS[1] ss:{e}:lease   HASH o (owner), t (token), with a TTL
                       (domain::records::LeaseHolder; a STR "owner|token" before)
KEYS[2] ss:{e}:token   STR counter of fencing tokens
ARGV[1] owner (no '|')   ARGV[2] ttl ms   ARGV[3] seize: "seize" (optional)

Returns {"OK", token} when the caller holds the lease (taken now with a fresh
token from INCR, or already its own: TTL renewed, same token), {"HELD", owner}
when another owner holds it. Tokens strictly increase across all owners, so a
bucket that has seen token t can refuse any mover still holding a token < t
(a mover that paused past its lease and woke up — Kleppmann's fencing). The
token is known only here, so it is its own field beside the owner as given.

With ARGV[3] = "seize" the caller takes the lease whoever holds it, always with
a fresh token: a close wins over background work (a rebalancer round, a saga's
consolidation, a dead instance's lease that has not expired yet). It must then
raise every bucket's fence to that token before it moves anything, so the
holder it displaced is refused by every bucket.
]]
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' and ARGV[3] ~= 'seize' then
  local owner, token
  if kind == 'hash' then
    local held = redis.call('HMGET', KEYS[1], 'o', 't')
    owner, token = held[1], held[2]
  else
    owner, token = string.match(redis.call('GET', KEYS[1]), '^(.*)|(%d+)$')
  end
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {'OK', token}
  end
  return {'HELD', owner}
end
local token = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'o', ARGV[1], 't', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {'OK', tostring(token)}
