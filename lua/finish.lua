--[[ finish.lua — ends a purchase saga at the home bucket.

KEYS[1] ss:{e#g#h}:stock   (existence only: a missing bucket answers "ST")
KEYS[2] ss:{e#g#h}:users   HASH user -> units held
KEYS[3] ss:{e#g#h}:reqs    HASH request id -> record
KEYS[4] ss:{e#g#h}:idx     HASH order id -> order entry
KEYS[5] ss:{e#g#h}:pend    ZSET request ids of pending sagas -> start ms
KEYS[6] ss:{e#g#h}:holds   ZSET order id -> pay-by ms   (events with holds only)
KEYS[7] ss:{e#g#h}:hunits  units in live holds          (events with holds only)
KEYS[8] ss:{e#g#h}:orders  STREAM (the hold record)     (events with holds only)
KEYS[9] ss:{e#g#h}:tok     HASH access tokens ("token" events only, which pass
                           the three keys above too; purchase.lua's contract)
ARGV[1] rid   ARGV[2] outcome: B (bought), S (sold out), A (abort)
ARGV[3] user  ARGV[4] qty   ARGV[5] order id (for B)
ARGV[6] entry: the order's index entry (for B; domain::model::OrderEntry, "C|…", or
        "H|…|pay_by" for a hold)
ARGV[7] record: the final record to keep under rid (domain::model::RequestRecord:
        "B|q|oid|bucket|probes" or "S|q|remaining"), '' to keep none (A, or no keep)
ARGV[8] limited: 1 when the event has a per-user limit (only then was a quota
        reserved, and is released)
ARGV[9] saga: the saga's order id (that of its pending record "P|q|oid|user|t")
ARGV[10] pay_by: events with holds only, the pay-by ms of a B; the order is in
         KEYS[6], its units in KEYS[7], and the hold record ARGV[11] goes into KEYS[8]
ARGV[11] hold: the hold record (domain::stream::StreamEntry::data, with ARGV[10])

Returns:
  "ST"             home bucket does not exist
  {"OK", first}    this call ended the saga (first: 1 when a B put the first
                   hold into a bucket that had none, else 0): B indexes the order;
                   S and A release the quota; the final record ARGV[7] is
                   stored, or the record deleted when it is ''.
  {"R", record}    the saga had already ended: its final record
  {"NR"}           no record under rid, or the pending record of another saga
                   (another order id: the request id was reused after this
                   saga was aborted) — that one is left alone
Whenever rid has no pending saga of its own any more, it leaves the pend set
(this call ended it, or found it ended); a pending saga of another order
keeps its entry.

A "token" event's saga that reserved its token's allowance at the home step
("s:<rid>" names the token) has the reservation turned into consumption
with a B ("r:<id>" down q: "t:<id>" counted it already) or given back
with S and A ("r:<id>" and "t:<id>" down q), in
this step: the order and its consumption are written once, together, by
the compare-and-set on the pending record above.

Every record is the engine's (domain/), stored as given.
One script so that the quota release, the index entry and the final record
change together: a concurrent driver of the same saga sees either the pending
record or the final one, never a released quota with a pending record.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
local rec = redis.call('HGET', KEYS[3], ARGV[1])
if not rec then
  redis.call('ZREM', KEYS[5], ARGV[1])
  return {'NR'}
end
if string.sub(rec, 1, 1) ~= 'P' then
  redis.call('ZREM', KEYS[5], ARGV[1])
  return {'R', rec}
end
local pending_oid = string.match(rec, '^P|[^|]*|([^|]*)|')
if pending_oid ~= ARGV[9] then
  return {'NR'}
end
redis.call('ZREM', KEYS[5], ARGV[1])
local outcome, user, qty = ARGV[2], ARGV[3], tonumber(ARGV[4])
local first = 0
if outcome == 'B' then
  redis.call('HSET', KEYS[4], ARGV[5], ARGV[6])
  if ARGV[10] then
    if redis.call('ZCARD', KEYS[6]) == 0 then first = 1 end
    redis.call('ZADD', KEYS[6], ARGV[10], ARGV[5])
    redis.call('INCRBY', KEYS[7], qty)
    redis.call('XADD', KEYS[8], '*', 'd', ARGV[11])
  end
elseif ARGV[8] == '1' then
  redis.call('HINCRBY', KEYS[2], user, -qty)
end
if KEYS[9] then
  local link = 's:' .. ARGV[1]
  local tid = redis.call('HGET', KEYS[9], link)
  if tid then
    redis.call('HINCRBY', KEYS[9], 'r:' .. tid, -qty)
    if outcome ~= 'B' then
      redis.call('HINCRBY', KEYS[9], 't:' .. tid, -qty)
    end
    redis.call('HDEL', KEYS[9], link)
  end
end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[7])
else
  redis.call('HDEL', KEYS[3], ARGV[1])
end
return {'OK', first}
