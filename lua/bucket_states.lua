--[[ bucket_states.lua — every bucket of an event read in one atomic step.

Only a server that holds every key may run it: a standalone Redis (on a
Cluster each bucket has a slot of its own, and the engine reads them one at a
time, checking what moved between its reads: engine::view).

KEYS  each bucket's bucket_state.lua KEYS (8), one bucket after another
Returns an array with one reply a bucket, in order, each as bucket_state.lua
answers it: "ST" (no such bucket) or its eight values. One atomic read, so
every bucket belongs to the same instant: no transfer can be half-way between
two of them.

bucket_state.lua's text takes the place of the include line below, as the body
of `one` (its KEYS are the bucket's own table).
]]
local function one(KEYS)
--#include bucket_state.lua
end

local out = {}
for i = 1, #KEYS / 8 do
  out[i] = one({unpack(KEYS, 8 * i - 7, 8 * i)})
end
return out
