--[[ expire_holds.lua — expires the held orders of a home bucket whose pay-by
deadline has passed (the sweeper), or every live hold (a close voids them).

KEYS[1] ss:{e#g#h}:stock   remaining units (expired units come back here)
KEYS[2] ss:{e#g#h}:users   HASH user -> units held (events with a per-user limit)
KEYS[3] ss:{e#g#h}:idx     HASH order id -> order entry ("H|…|pay_by" while held)
KEYS[4] ss:{e#g#h}:orders  STREAM (one expire record per expired order: k ARGV[3],
                           o the order id, h its held entry as found)
KEYS[5] ss:{e#g#h}:adds    addition count, +1 when units came back
KEYS[6] ss:{e#g#h}:sealed  a sealed bucket answers "ST" unless voiding
KEYS[7] ss:{e#g#h}:holds   ZSET order id -> pay-by ms of live holds
KEYS[8] ss:{e#g#h}:hunits  units in live holds
KEYS[9] ss:{e#g#h}:hq      LIST "pay_by|oid" of fast-path holds in deadline order
                           (purchase.lua); entries of orders no longer held
                           stay until due
KEYS[10] ss:{e#g#h}:wl      HASH the bucket's waiting list (draw events): while its
                           field on is "1", returned units go aside (fields aside
                           and units), not back in stock: they are offered to the
                           line (reserve_offers.lua), never put on open sale
ARGV[1] now ms   ARGV[2] count: at most this many orders
ARGV[3] head: the expire records' head "e|h|h|now" (domain::stream::CopyHead)
ARGV[4] void: 1 = void every live hold whatever its deadline, sealed or not (a close,
        which sealed the bucket itself); 0 = only those due (pay_by <= now)
ARGV[5] expired: the expired state (domain::model::EntryState::tag), put in place
        of the entry's first field

Returns "ST" (no bucket, or sealed and not voiding), else
{"OK", next, oid, entry, oid, entry, …}: next is the earliest pay-by left in the
index or at the queue's head ('' when both are empty), then each order this call expired with its entry after
the change ("E…"). The expire record copies the held entry verbatim beside
the engine's head (domain::stream::StreamEntry::from_copy). Per order, in this one step: out of the index, entry "E…",
units back in stock, the user's count down, held units down, the expire
record written — so units return and counts drop exactly once, however many
sweepers run, die or repeat. An index entry whose order is no longer held
(cancelled or confirmed in the same step that should have removed it) is
only dropped. The index is read first, then the queue from its head, up to
that many (ARGV[2]) entries in all; the queue stops at its first entry not due (one
written by an instance whose clock ran behind waits for the one before it:
late by that skew, never lost).
]]
-- Units that come back: aside for the waiting line while the bucket's list is
-- on (a draw's), else back in stock.
--#include lib/give_back.lua
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
local void = ARGV[4] == '1'
if not void and redis.call('EXISTS', KEYS[6]) == 1 then
  return 'ST'
end
local ids
if void then
  ids = redis.call('ZRANGE', KEYS[7], 0, tonumber(ARGV[2]) - 1)
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
end
local out = {'OK', ''}
local back = 0
local function expire(oid)
  local entry = redis.call('HGET', KEYS[3], oid)
  if entry and string.sub(entry, 1, 1) == 'H' then
    local user, qty = string.match(entry, '^H|([^|]*)|([^|]*)|')
    local expired = ARGV[5] .. string.sub(entry, 2)
    redis.call('HSET', KEYS[3], oid, expired)
    if redis.call('HEXISTS', KEYS[2], user) == 1 then
      redis.call('HINCRBY', KEYS[2], user, -tonumber(qty))
    end
    redis.call('DECRBY', KEYS[8], qty)
    back = back + tonumber(qty)
    redis.call('XADD', KEYS[4], '*', 'k', ARGV[3], 'o', oid, 'h', entry)
    out[#out + 1] = oid
    out[#out + 1] = expired
  end
end
for _, oid in ipairs(ids) do
  redis.call('ZREM', KEYS[7], oid)
  expire(oid)
end
local room = tonumber(ARGV[2]) - #ids
if room > 0 then
  local now, taken = tonumber(ARGV[1]), 0
  for _, head in ipairs(redis.call('LRANGE', KEYS[9], 0, room - 1)) do
    local pay_by, oid = string.match(head, '^(%-?%d+)|(.*)$')
    if not void and tonumber(pay_by) > now then break end
    taken = taken + 1
    expire(oid)
  end
  if taken > 0 then redis.call('LTRIM', KEYS[9], taken, -1) end
end
if back > 0 then
  give_back(KEYS[1], KEYS[10], back)
  redis.call('INCR', KEYS[5])
end
local next = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')
local head = redis.call('LINDEX', KEYS[9], 0)
if head then
  local queued = string.match(head, '^(%-?%d+)|')
  if not next[2] or tonumber(queued) < tonumber(next[2]) then next[2] = queued end
end
if next[2] then out[2] = next[2] end
return out
