--[[ set_empty.lua — marks a bucket's copy of "the whole event holds at most
`left` units": orders of more are sold out.

KEYS[1] ss:{e#g#b}:empty   KEYS[2] ss:{e#g#b}:epoch
ARGV[1] epoch: the bucket's epoch as read by the consistent probe that found the event short
ARGV[2] ttl: how long the mark lives (ms): a mark is trusted only so long, as the
        meta's is, so even a "units came back" that never finished cannot
        keep a bucket answering "sold out" for longer
ARGV[3] mark: "epoch|left" (domain::records::EmptyMark), stored as given; left is
        the units the probe found in the whole event (an upper bound for as
        long as the epoch holds: units only leave until some come back)

Returns 1 when marked, 0 when the epoch moved on since the probe (units came
back somewhere: the mark would be false). From then on purchase.lua answers
"sold out" in its one call to an order of more than `left` units, until the
epoch is bumped again.
]]
if (redis.call('GET', KEYS[2]) or '0') ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
return 1
