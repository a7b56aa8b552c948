--[[ settle_transfers.lua — records that a takeover settled a layout's transfers.

KEYS[1] ss:{e}:xsettled   HASH layout generation -> token
ARGV[1] generation: the layout's   ARGV[2] token: the mover's
Returns 1 when recorded, 0 when a higher token was recorded already.

Written by a mover that raised the fence of every bucket of the layout to its
token and then completed every transfer open there: from then on every
transfer made in that layout under a lower token is closed and can never
open again (its OUT is refused by the fence), so the buckets may forget
their ids (raise_fence.lua). Monotonic, so a mover that stalled past a newer
one's record cannot lower it.
]]
local seen = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) > seen then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
