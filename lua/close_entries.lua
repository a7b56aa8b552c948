--[[ close_entries.lua — closes a draw's entry shard for good.

KEYS[1] ss:{d#<event>#<k>}:ent   ZSET the shard's entrants
KEYS[2] ss:{d#<event>#<k>}:shut  STR  present once the shard is closed

Returns the shard's entrants' count.

The draw closes every shard before it reads one: after this step no entry
lands here (enter.lua checks the same key), so what the draw reads is final.
]]
redis.call('SET', KEYS[2], '1')
return redis.call('ZCARD', KEYS[1])
