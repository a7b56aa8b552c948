--[[ enter.lua — enters users in a draw's entry shard, in order, unless it is
closed: the entries of one shard that arrived together (the engine's entry
batcher, as purchases are batched per bucket).

KEYS[1] ss:{d#<event>#<k>}:ent   ZSET the shard's entrants (score 0)
KEYS[2] ss:{d#<event>#<k>}:shut  STR  present once the shard is closed
ARGV[i] user: the user ids, i = 1..n

Returns {"CL"} (the shard is closed: the entry window is over, for every
user of the call), else one code a user, in order: "N" (entered now) or
"AL" (entered before, by an earlier call or earlier in this one: nothing
changed).

One step: the check of the close and the adds are atomic, so an entry the
draw did not read is one this step refused. A call of n users costs one
script call and n ZADDs: an entry a call cost 1.14x the CPU of a batched
purchase over HTTP (BENCHMARKS.md, "Fair drops").
]]
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'CL'}
end
local out = {}
for i = 1, #ARGV do
  out[i] = redis.call('ZADD', KEYS[1], 'NX', 0, ARGV[i]) == 1 and 'N' or 'AL'
end
return out
