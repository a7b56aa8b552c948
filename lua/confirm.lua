--[[ confirm.lua — confirms a held order in its home bucket, or finds its
deadline passed and expires it: confirm and expiry are decided here, in one
step, so a confirm racing the sweeper ends exactly one way.

KEYS[1] ss:{e#g#h}:stock   remaining units (an expiry puts the units back here)
KEYS[2] ss:{e#g#h}:users   HASH user -> units held (events with a per-user limit)
KEYS[3] ss:{e#g#h}:idx     HASH order id -> order entry
                           ("H|user|qty|bucket|rid|at|pay_by" while held)
KEYS[4] ss:{e#g#h}:orders  STREAM (the confirm or expire record goes here: k its head,
                           o the order id, h the held entry as found)
KEYS[5] ss:{e#g#h}:adds    addition count, +1 when an expiry puts units back
KEYS[6] ss:{e#g#h}:sealed  a sealed bucket answers "ST" (closed, or being moved
                           by a reshard: the caller reloads the layout)
KEYS[7] ss:{e#g#h}:holds   ZSET order id -> pay-by ms of live holds
KEYS[8] ss:{e#g#h}:hunits  units in live holds
KEYS[9] ss:{e#g#h}:hq      (unused here: a fast-path hold's queue entry stays
                           until expire_holds.lua drops it when due)
KEYS[10] ss:{e#g#h}:wl      HASH the bucket's waiting list (draw events): while its
                           field on is "1", returned units go aside (fields aside
                           and units), not back in stock: they are offered to the
                           line (reserve_offers.lua), never put on open sale
ARGV[1] now ms   ARGV[2] order id
ARGV[3] confirm: the confirm record's head "k||h|now" (domain::stream::CopyHead:
        the bucket is the entry's)
ARGV[4] expire: the expire record's head "e|h|h|now"
ARGV[5] confirmed: the confirmed state   ARGV[6] expired: the expired state
        (domain::model::EntryState::tag), put in place of the entry's first field

Returns:
  "ST"              bucket does not exist or is sealed
  {"OK", entry}     confirmed now (now < pay_by): entry "C…" after the change,
                    out of the deadline index, a confirm record written
  {"AK", entry}     already confirmed (or never held): nothing changed
  {"EX", entry, e}  expired: e = 1 when this call expired it (now >= pay_by:
                    units back in stock or aside, the user's count down, entry "E…",
                    an expire record), 0 when it had expired before
  {"CX", entry}     cancelled before: nothing changed
  {"NF"}            no such order here
The records copy the held entry verbatim beside the engine's head: none is
assembled here (domain::stream::StreamEntry::from_copy).
]]
-- Units that come back: aside for the waiting line while the bucket's list is
-- on (a draw's), else back in stock.
--#include lib/give_back.lua
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[6]) == 1 then
  return 'ST'
end
local entry = redis.call('HGET', KEYS[3], ARGV[2])
if not entry then
  return {'NF'}
end
local state = string.sub(entry, 1, 1)
if state == 'C' then
  return {'AK', entry}
elseif state == 'X' then
  return {'CX', entry}
elseif state == 'E' then
  return {'EX', entry, 0}
end
local user, qty, pay_by = string.match(entry, '^H|([^|]*)|([^|]*)|[^|]*|[^|]*|[^|]*|([^|]*)$')
redis.call('ZREM', KEYS[7], ARGV[2])
redis.call('DECRBY', KEYS[8], qty)
if tonumber(ARGV[1]) < tonumber(pay_by) then
  local confirmed = ARGV[5] .. string.sub(entry, 2)
  redis.call('HSET', KEYS[3], ARGV[2], confirmed)
  redis.call('XADD', KEYS[4], '*', 'k', ARGV[3], 'o', ARGV[2], 'h', entry)
  return {'OK', confirmed}
end
local expired = ARGV[6] .. string.sub(entry, 2)
redis.call('HSET', KEYS[3], ARGV[2], expired)
if redis.call('HEXISTS', KEYS[2], user) == 1 then
  redis.call('HINCRBY', KEYS[2], user, -tonumber(qty))
end
give_back(KEYS[1], KEYS[10], qty)
redis.call('INCR', KEYS[5])
redis.call('XADD', KEYS[4], '*', 'k', ARGV[4], 'o', ARGV[2], 'h', entry)
return {'EX', expired, 1}
