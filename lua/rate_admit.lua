--[[ rate_admit.lua — one request of a buyer at its rate (GCRA), shared by
every instance.

KEYS[1] ss:{u#<user>}:rate   STR the user's theoretical arrival time, µs of
                             Redis's clock (PX: gone once it is in the past)
ARGV[1] interval: the emission interval, µs (1e6 / requests a second)
ARGV[2] tolerance: the tolerance, µs (interval × (burst − 1))

Returns 0 when admitted (the arrival time moved on by one interval), else
the µs until the next request is admitted (nothing changed).

Redis's own clock (TIME), so instances whose clocks differ keep one rate.
One key under the user's hash tag: users spread over a Cluster's masters,
and the check and the update are one step, so two instances admitting the
same user at once count both. The arithmetic is `store::limits::gcra`.
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then
  tat = now
end
local allow_at = tat - tonumber(ARGV[2])
if now < allow_at then
  return allow_at - now
end
local next_tat = tat + tonumber(ARGV[1])
redis.call('SET', KEYS[1], string.format('%d', next_tat), 'PX',
  math.floor((next_tat - now) / 1000) + 1)
return 0
