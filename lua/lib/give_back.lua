--[[ lib/give_back.lua — not a step: a function the scripts that give units
back include, its text in place of their include line (cancel.lua,
confirm.lua, expire_holds.lua; store::redis::scripts::INCLUDES).

give_back(stock, list, units): units that come back to a bucket go aside for
the waiting line while the bucket's waiting list is on (a draw's: `list` is
its HASH ss:{e#g#j}:wl, fields on, aside, units), else back in stock (`stock`
is ss:{e#g#j}:stock). The memory store's mirror is `Bucket::give_back` (store::memory::offers).
]]
local function give_back(stock, list, units)
  if redis.call('HGET', list, 'on') == '1' then
    redis.call('HINCRBY', list, 'aside', units)
    redis.call('HINCRBY', list, 'units', units)
  else
    redis.call('INCRBY', stock, units)
  end
end
