--[[ cancel.lua — cancels an order in its home bucket.

KEYS[1] ss:{e#g#h}:stock   remaining units (the cancelled units come back here)
KEYS[2] ss:{e#g#h}:users   HASH user -> units held (events with a per-user limit)
KEYS[3] ss:{e#g#h}:idx     HASH order id -> "C|user|qty|bucket|rid|at" (X when cancelled)
KEYS[4] ss:{e#g#h}:orders  STREAM (the cancel record goes here: k ARGV[2], o the order
                           id, h the order's index entry as found)
KEYS[5] ss:{e#g#h}:adds    addition count, +1 (units appeared here)
KEYS[6] ss:{e#g#h}:sealed  a sealed bucket refuses cancels ("ST"): its contents
                           are final (closed, or being moved by a reshard)
KEYS[7] ss:{e#g#h}:holds   ZSET order id -> pay-by ms of live holds
KEYS[8] ss:{e#g#h}:hunits  units in live holds
KEYS[9] ss:{e#g#h}:wl      HASH the bucket's waiting list (draw events): while its
                           field on is "1", returned units go aside (fields aside
                           and units), not back in stock: they are offered to the
                           line (reserve_offers.lua), never put on open sale
ARGV[1] order id
ARGV[2] head: the cancel record's head "c|h|h|now" (domain::stream::CopyHead)
ARGV[3] cancelled: the cancelled state (domain::model::EntryState::tag), put in
        place of the entry's first field

Returns:
  "ST"            bucket does not exist
  {"OK", entry}   cancelled: units back in stock, user count down, entry marked X,
                  cancel record in the stream; entry is the entry before the change
  {"AC", entry}   already cancelled, or a hold that expired ("E…"): nothing changed
A held order ("H…") is cancelled like a confirmed one, and leaves the
deadline index and the held units in the same step (so it never expires too).
  {"NF"}          no such order here

The cancel record copies the stored entry verbatim (its user and qty)
beside the engine's head: no record is assembled here
(domain::stream::StreamEntry::from_copy).
Atomic so that the units come back exactly once: a second cancel sees the X
and changes nothing; the cancel record that the flusher turns into "released"
units is written with the change, never without it.
]]
-- Units that come back: aside for the waiting line while the bucket's list is
-- on (a draw's), else back in stock.
--#include lib/give_back.lua
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[6]) == 1 then
  return 'ST'
end
local entry = redis.call('HGET', KEYS[3], ARGV[1])
if not entry then
  return {'NF'}
end
local state = string.sub(entry, 1, 1)
if state == 'X' or state == 'E' then
  return {'AC', entry}
end
local user, qty = string.match(entry, '^[CH]|([^|]*)|([^|]*)|')
if state == 'H' then
  redis.call('ZREM', KEYS[7], ARGV[1])
  redis.call('DECRBY', KEYS[8], qty)
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3] .. string.sub(entry, 2))
if redis.call('HEXISTS', KEYS[2], user) == 1 then
  redis.call('HINCRBY', KEYS[2], user, -tonumber(qty))
end
give_back(KEYS[1], KEYS[9], qty)
redis.call('INCR', KEYS[5])
redis.call('XADD', KEYS[4], '*', 'k', ARGV[2], 'o', ARGV[1], 'h', entry)
return {'OK', entry}
