--[[ finish.lua — ends a purchase saga at the home bucket.

KEYS[1] ss:{e#g#h}:stock   (existence only: a missing bucket answers "ST")
KEYS[2] ss:{e#g#h}:users   HASH user -> units held
KEYS[3] ss:{e#g#h}:reqs    HASH request id -> record
KEYS[4] ss:{e#g#h}:idx     HASH order id -> order entry
KEYS[5] ss:{e#g#h}:pend    ZSET request ids of pending sagas -> start ms
KEYS[6] ss:{e#g#h}:holds   ZSET order id -> pay-by ms   (events with holds only)
KEYS[7] ss:{e#g#h}:hunits  units in live holds          (events with holds only)
KEYS[8] ss:{e#g#h}:orders  STREAM (the hold record)     (events with holds only)
ARGV[1] now   ARGV[2] rid   ARGV[3] outcome: B (bought), S (sold out), A (abort)
ARGV[4] user  ARGV[5] qty   ARGV[6] keep (1 = keep the final record)
ARGV[7] order id  ARGV[8] bucket the units came from  ARGV[9] probes  (for B)
ARGV[10] remaining units seen (for S)   ARGV[11] limited: 1 when the event has a per-user
         limit (only then was a quota reserved, and is released)
ARGV[12] saga: the saga's order id (that of its pending record "P|q|oid|user|t")
ARGV[13] pay_by: events with holds only, the pay-by ms of a B; the order is indexed as
         "H|user|q|bucket|rid|now|pay_by", in KEYS[6], its units in KEYS[7], and
         the hold record ARGV[14] goes into KEYS[8]
ARGV[14] hold: the hold record "h|oid|user|q|bucket|h|rid|pay_by" (with ARGV[13])

Returns:
  "ST"             home bucket does not exist
  {"OK", first}    this call ended the saga (first: 1 when a B put the first
                   hold into a bucket that had none, else 0): B indexes the order and (keep)
                   stores "B|q|oid|bucket|probes"; S releases the quota and
                   (keep) stores "S|q|remaining"; A releases the quota and
                   deletes the record. Without keep the record is deleted.
  {"R", record}    the saga had already ended: its final record
  {"NR"}           no record under rid, or the pending record of another saga
                   (another order id: the request id was reused after this
                   saga was aborted) — that one is left alone
Whenever rid has no pending saga of its own any more, it leaves the pend set
(this call ended it, or found it ended); a pending saga of another order
keeps its entry.

One script so that the quota release, the index entry and the final record
change together: a concurrent driver of the same saga sees either the pending
record or the final one, never a released quota with a pending record.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
local rec = redis.call('HGET', KEYS[3], ARGV[2])
if not rec then
  redis.call('ZREM', KEYS[5], ARGV[2])
  return {'NR'}
end
if string.sub(rec, 1, 1) ~= 'P' then
  redis.call('ZREM', KEYS[5], ARGV[2])
  return {'R', rec}
end
local pending_oid = string.match(rec, '^P|[^|]*|([^|]*)|')
if pending_oid ~= ARGV[12] then
  return {'NR'}
end
redis.call('ZREM', KEYS[5], ARGV[2])
local outcome, user, qty, keep = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6] == '1'
local final = false
local first = 0
if outcome == 'B' then
  local entry = user .. '|' .. qty .. '|' .. ARGV[8] .. '|' .. (keep and ARGV[2] or '') .. '|' .. ARGV[1]
  if ARGV[13] then
    if redis.call('ZCARD', KEYS[6]) == 0 then first = 1 end
    redis.call('HSET', KEYS[4], ARGV[7], 'H|' .. entry .. '|' .. ARGV[13])
    redis.call('ZADD', KEYS[6], ARGV[13], ARGV[7])
    redis.call('INCRBY', KEYS[7], qty)
    redis.call('XADD', KEYS[8], '*', 'd', ARGV[14])
  else
    redis.call('HSET', KEYS[4], ARGV[7], 'C|' .. entry)
  end
  final = 'B|' .. qty .. '|' .. ARGV[7] .. '|' .. ARGV[8] .. '|' .. ARGV[9]
else
  if ARGV[11] == '1' then
    redis.call('HINCRBY', KEYS[2], user, -qty)
  end
  if outcome == 'S' then
    final = 'S|' .. qty .. '|' .. ARGV[10]
  end
end
if keep and final then
  redis.call('HSET', KEYS[3], ARGV[2], final)
else
  redis.call('HDEL', KEYS[3], ARGV[2])
end
return {'OK', first}
