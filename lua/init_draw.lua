--[[ init_draw.lua — keeps a draw's seed unless one is kept.

KEYS[1] ss:{d#<event>}:draw  HASH the draw's record: seed (hex), done
ARGV[1] seed: 32 random bytes in lowercase hex, drawn by the engine

Returns the seed kept: this one, or the one an earlier create kept.

One step so that two creators of one event (a retried create) publish the
hash of the one seed that will be revealed.
]]
redis.call('HSETNX', KEYS[1], 'seed', ARGV[1])
return redis.call('HGET', KEYS[1], 'seed')
