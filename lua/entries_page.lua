--[[ entries_page.lua — a page of a draw's entry shard, in id order.

KEYS[1] ss:{d#<event>#<k>}:ent   ZSET the shard's entrants (score 0: lexical order)
ARGV[1] after: the last user id of the previous page ('' = from the first)
ARGV[2] limit: entrants to answer at most (0 = none: the count alone)

Returns the shard's entrants' count when the limit is 0, else the entrants
after `after`, ascending, at most `limit`.

A read; one script so that the count and the page run on the shard's slot.
]]
local limit = tonumber(ARGV[2])
if limit == 0 then
  return redis.call('ZCARD', KEYS[1])
end
local from = '-'
if ARGV[1] ~= '' then
  from = '(' .. ARGV[1]
end
return redis.call('ZRANGEBYLEX', KEYS[1], from, '+', 'LIMIT', 0, limit)
