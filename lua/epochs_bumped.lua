--[[ epochs_bumped.lua — every bucket's epoch was bumped for a due recorded by bump_seq.lua.

KEYS[1] ss:{e}:meta   ARGV[1] due: the value bump_seq.lua answered
Returns 1 when the due was cleared, 0 when another one was recorded since (a
newer sold-out mark went stale: its caller bumps the epochs again and clears it).
]]
if redis.call('HGET', KEYS[1], 'epochs_due') ~= ARGV[1] then
  return 0
end
redis.call('HDEL', KEYS[1], 'epochs_due')
return 1
