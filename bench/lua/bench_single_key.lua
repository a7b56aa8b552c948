--[[ bench_single_key.lua — the single-key baseline (seed 002 §4), made
multi-unit: check and decrement one stock key in one step.

KEYS[1] bench:{<run id>}:stock   remaining units (an integer string)
ARGV[1] qty                      units asked for, >= 1

Returns:
  1   qty units taken
  0   fewer than qty left; nothing changed

The read and the decrement are one atomic step, so two buyers can never both
see the same last unit: the key never goes below zero and no buyer is refused
while qty units are left. A missing key counts as zero stock. All buyers of the
product meet on this one key, so its throughput is one Redis core's — the
ceiling that segmented stock exists to lift.
]]
local qty = tonumber(ARGV[1])
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
if stock >= qty then
  redis.call('DECRBY', KEYS[1], qty)
  return 1
end
return 0
