--[[ lease_renew.lua — heartbeat or release of a mover lease (or, on KEYS[1]
ss:{e}:leader with its term, of the rebalancer's leadership).

KEYS[1] ss:{e}:lease   HASH o, t (lease_acquire.lua), or an older STR "owner|token"
ARGV[1] owner   ARGV[2] token   ARGV[3] ttl ms (0 = release)
ARGV[4] legacy: "owner|token", the holder as an older lease_acquire.lua stored it
        (domain::records::LeaseHolder::legacy), compared verbatim
Returns 1 when the caller still held the lease with this token (renewed, or
deleted for ttl 0), 0 when it had lost it: the caller must stop moving units.
]]
local kind = redis.call('TYPE', KEYS[1])['ok']
local held = false
if kind == 'hash' then
  local h = redis.call('HMGET', KEYS[1], 'o', 't')
  held = h[1] == ARGV[1] and h[2] == ARGV[2]
elseif kind == 'string' then
  held = redis.call('GET', KEYS[1]) == ARGV[4]
end
if not held then
  return 0
end
if ARGV[3] == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
