--[[ raise_fence.lua — a new leader fences a bucket before anything else.

KEYS[1] ss:{e#g#b}:fence   ARGV[1] the new leader's token
Returns the bucket's fence afterwards. Raising every bucket's fence at takeover
means a paused former leader (holding a lower token) is refused by every
bucket, not only by those the new leader happens to move units through.
]]
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token > fence then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return string.format('%d', fence)
