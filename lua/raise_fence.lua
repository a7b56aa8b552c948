--[[ raise_fence.lua — a new leader fences a bucket before anything else, and
the bucket forgets what no step can ask about again.

KEYS[1] ss:{e#g#b}:fence   highest fencing token the bucket has accepted
KEYS[2] ss:{e#g#b}:xfer    HASH transfers out of b: xid -> "target|units|token|o|d"
KEYS[3] ss:{e#g#b}:xin     HASH transfers applied into b: xid -> "source|units"
KEYS[4] ss:{e#g#b}:stock   remaining units; missing = no such bucket (answers "ST")
ARGV[1] token: the new leader's
ARGV[2] mover_below: forget applied movers' ids ("<token>.<from>.<to>.<nonce>") whose token is lower
ARGV[3] reshard_below: forget applied reshards' ids ("rs.<gen>.<from>.<to>.<token>.<pass>") whose token is lower
Returns the bucket's fence afterwards, or "ST" for a bucket that does not
exist (not created yet, retired, lost): nothing is written, so no fence key
outlives its bucket, as in the memory store.

Raising every bucket's fence at takeover means a paused former leader
(holding a lower token) is refused by every bucket, not only by those the new
leader happens to move units through. What is forgotten (domain::transfer):
- a tombstone (a cleared transfer, "…|d") whose token is below the fence: a
  late duplicate OUT under that token is refused by the fence first;
- an applied id below the tokens the caller names: the caller read them from
  the event's settled tokens (a takeover that fenced the whole layout and
  closed every transfer open there), so no IN of it can come again.
An open entry ("…|o") is never forgotten. Without this both hashes grew with
every transfer the event ever made, and every short take, view, rebalancer
plan and audit reads them whole.
]]
if redis.call('EXISTS', KEYS[4]) == 0 then
  return 'ST'
end
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token > fence then
  redis.call('SET', KEYS[1], ARGV[1])
  fence = token
end
local journal = redis.call('HGETALL', KEYS[2])
for i = 1, #journal, 2 do
  local t, state = string.match(journal[i + 1], '^[^|]*|[^|]*|(%d+)|(%a)$')
  if state == 'd' and tonumber(t) < fence then
    redis.call('HDEL', KEYS[2], journal[i])
  end
end
local mover_below, reshard_below = tonumber(ARGV[2]), tonumber(ARGV[3])
if mover_below > 0 or reshard_below > 0 then
  for _, xid in ipairs(redis.call('HKEYS', KEYS[3])) do
    local t = string.match(xid, '^rs%.%d+%.%d+%.%d+%.(%d+)%.')
    local below = reshard_below
    if not t then
      t = string.match(xid, '^(%d+)%.')
      below = mover_below
    end
    if t and tonumber(t) < below then
      redis.call('HDEL', KEYS[3], xid)
    end
  end
end
return string.format('%d', fence)
