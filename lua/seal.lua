--[[ seal.lua — stops a bucket from selling (end of sale, or the old layout of a reshard).

KEYS[1] ss:{e#g#b}:stock   KEYS[2] ss:{e#g#b}:sealed
Returns "ST" when the bucket does not exist, else its stock at the moment it
was sealed. From then on purchase.lua, take.lua and the transfer steps answer
"ST" (the caller reloads the event and finds it closed or resharded), while
finish.lua, untake.lua and cancel.lua still work, so sagas already under way
can be ended cleanly. Idempotent.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
redis.call('SET', KEYS[2], '1')
return redis.call('GET', KEYS[1])
