--[[ bench_single_key_xadd.lua — the single-key baseline plus its order
record: what a hand-written endpoint that also keeps its orders does.

KEYS[1] bench:{<id>}:stock    remaining units (an integer string)
KEYS[2] bench:{<id>}:orders   STREAM of order records
ARGV[1] qty                   units asked for, >= 1
ARGV[2] record                the order record ("user|qty|request id")

Returns:
  1   qty units taken, the record appended (field d)
  0   fewer than qty left; nothing changed

The check, the decrement and the record are one atomic step. No idempotency,
no per-user limit, no ledger: the peer shardstock's HTTP cost is judged against.
]]
local qty = tonumber(ARGV[1])
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
if stock >= qty then
  redis.call('DECRBY', KEYS[1], qty)
  redis.call('XADD', KEYS[2], '*', 'd', ARGV[2])
  return 1
end
return 0
