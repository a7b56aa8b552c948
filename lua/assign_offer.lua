--[[ assign_offer.lua — gives a bucket's ticket the next position of a draw's
waiting line, once, at the list's own slot.

KEYS[1] ss:{w#e}:list   HASH len, next, a:<bucket>:<ticket> -> position (0:
                        nobody left), o:<position> -> "<bucket>|<ticket>"
KEYS[2] ss:{w#e}:line   HASH position -> user (the draw's)
ARGV[1] field: the ticket's assignment field "a:<bucket>:<ticket>"
        (domain::offer::assignment_field)
ARGV[2] placement: "<bucket>|<ticket>" (domain::offer::placement), stored as given

Returns {"W"} (no list: not drawn), {"X"} (every position was given before
this ticket asked: nobody left for it, now and whenever it asks again) or
{"OK", position, user}: the position given now, or the one given before.
Atomic so positions are given in line order, each to one ticket, and a
ticket keeps the first position it got, however many sweepers ask.
]]
if redis.call('HEXISTS', KEYS[1], 'len') == 0 then
  return {'W'}
end
local given = redis.call('HGET', KEYS[1], ARGV[1])
if given == '0' then
  return {'X'}
end
if not given then
  local next = tonumber(redis.call('HGET', KEYS[1], 'next') or '1')
  if next > tonumber(redis.call('HGET', KEYS[1], 'len')) then
    redis.call('HSET', KEYS[1], ARGV[1], 0)
    return {'X'}
  end
  given = tostring(next)
  redis.call('HSET', KEYS[1], ARGV[1], given, 'o:' .. given, ARGV[2], 'next', next + 1)
end
return {'OK', given, redis.call('HGET', KEYS[2], given) or ''}
