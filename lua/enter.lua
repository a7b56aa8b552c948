--[[ enter.lua — enters a user in a draw's entry shard, unless it is closed.

KEYS[1] ss:{d#<event>#<k>}:ent   ZSET the shard's entrants (score 0)
KEYS[2] ss:{d#<event>#<k>}:shut  STR  present once the shard is closed
ARGV[1] user: the user id

Returns {"N"} (entered now), {"AL"} (entered before: nothing changed) or
{"CL"} (the shard is closed: the entry window is over).

One step, as cheap as a purchase: the check of the close and the add are
atomic, so an entry the draw did not read is one this step refused.
]]
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'CL'}
end
if redis.call('ZADD', KEYS[1], 'NX', 0, ARGV[1]) == 1 then
  return {'N'}
end
return {'AL'}
