--[[ set_token_keys.lua — replaces a token or draw event's keys (a rotation).

KEYS[1] ss:{e}:meta   ARGV[1] token_keys: the new keys, space-separated
Returns 1 when the keys were replaced, 0 when the event does not exist, has
no keys (its access mode is open: keys would make it refuse every buyer
without a token) or is closed.

One field of the meta, written in one step with the checks: the engines
read it with the meta, each within a second (`control::draw_timer`).
]]
local m = redis.call('HMGET', KEYS[1], 'tokens', 'status')
if not m[1] or m[1] == '' or m[2] == 'closed' then
  return 0
end
redis.call('HSET', KEYS[1], 'tokens', ARGV[1])
return 1
