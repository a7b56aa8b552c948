--[[ entry_rank.lua — whether a user entered a draw, and its rank once drawn.

KEYS[1] ss:{d#<event>#<k>}:ent   ZSET the shard's entrants
KEYS[2] ss:{d#<event>#<k>}:rank  HASH user -> rank in the draw (1-based)
ARGV[1] user: the user id

Returns {0} (never entered), {1} (entered, not drawn) or {1, rank}.

A read of two keys of the shard's slot at once.
]]
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {0}
end
local rank = redis.call('HGET', KEYS[2], ARGV[1])
if rank then
  return {1, rank}
end
return {1}
