--[[ decide_order.lua — decides a release order at the user's home: commit
(pending → bought) or abort (pending → refused), by compare-and-set.

KEYS[1] ss:{r#<release>#h<h>}:reqs   HASH request id -> home record
KEYS[2] ss:{r#<release>#h<h>}:pend   ZSET request ids of orders not ended -> start ms
KEYS[3] ss:{r#<release>#h<h>}:oids   HASH order id -> request id (bought orders)
ARGV[1] rid
ARGV[2] expected: the pending record the caller drives ("P|…")
ARGV[3] decided: the record to put in its place ("B|…" or "R|…")
ARGV[4] ended: 1 when the decision ends the order (a commit: it leaves pend),
        0 when the order stays listed (an abort: its undo and release follow;
        a hold: its confirm, cancel or expiry follows)
ARGV[5] alias: the order id; when given (a commit, plain or as a hold), it
        is indexed to the request id (oids) with the decision: a read,
        confirm or cancel of the order finds its record by its id
ARGV[6] listed_at (only with ARGV[5]): the order's new score in pend (a
        hold's pay_by, so that the open holds do not fill the sweeper's
        listing of the pending and refused orders started before its bound)

Returns {"OK"} (this call decided), {"R", record} (the record is not the
expected one: already decided, this is the decision) or {"NR"} (no record).

The one decision point of an order: whoever comes first (the driver, a
retry on another instance, the sweeper) decides, everyone after finds the
decision and follows it. A held order's later states (confirming,
cancelling, expiring, then their ends) move by the same compare-and-set, so
confirm, cancel and expiry decide a hold once. Every record is the engine's, compared and stored
whole.
]]
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then
  return {'NR'}
end
if rec ~= ARGV[2] then
  return {'R', rec}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[5] then
  redis.call('HSET', KEYS[3], ARGV[5], ARGV[1])
end
if ARGV[4] == '1' then
  redis.call('ZREM', KEYS[2], ARGV[1])
elseif ARGV[6] then
  redis.call('ZADD', KEYS[2], 'XX', tonumber(ARGV[6]), ARGV[1])
end
return {'OK'}
