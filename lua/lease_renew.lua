--[[ lease_renew.lua — heartbeat or release of a mover lease (or, on KEYS[1]
ss:{e}:leader with its term, of the rebalancer's leadership).

KEYS[1] ss:{e}:lease   ARGV[1] owner   ARGV[2] token   ARGV[3] ttl ms (0 = release)
Returns 1 when the caller still held the lease with this token (renewed, or
deleted for ttl 0), 0 when it had lost it: the caller must stop moving units.
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. '|' .. ARGV[2] then
  return 0
end
if ARGV[3] == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
