--[[ purchase.lua — the HOME step: the fast path of a purchase, for a batch of
entries that share one home bucket, applied in order.

KEYS[1] ss:{e#g#b}:stock   remaining units (string integer); missing = no such bucket
KEYS[2] ss:{e#g#b}:users   HASH user -> units held (bought + reserved), users homed
                           here; kept only for events with a per-user limit
KEYS[3] ss:{e#g#b}:reqs    HASH request id -> outcome record
KEYS[4] ss:{e#g#b}:orders  STREAM of order records, one field d = "o|oid|user|q|b|h|rid|t"
                           (a held order's ends "|pay_by")
KEYS[5] ss:{e#g#b}:idx     HASH order id -> order entry "C|user|q|b|rid|t"
KEYS[6] ss:{e#g#b}:sealed  exists once the bucket is sealed (closed, resharded)
KEYS[7] ss:{e#g#b}:demand  units asked for by buyers homed here (the rebalancer's signal)
KEYS[8] ss:{e#g#b}:empty   "epoch|left": at that epoch the whole event was found
                           to hold at most left units (older marks: "epoch", none)
KEYS[9] ss:{e#g#b}:epoch   bumped (on every bucket) whenever units come back to a
                           sold-out event; the empty mark holds only while equal
KEYS[10] ss:{e#g#b}:pend   ZSET request ids of sagas pending here -> start ms
ARGV[1] now (unix ms)
ARGV[2] b, this bucket's index
ARGV[3] n, the number of entries; then n groups of 10:
        user, qty, limit (0 = none), rid, keep (1 = store the outcome), order id,
        and, built by the caller so that the script only writes them: the
        stream record "o|oid|user|q|b|b|rid|now", the index entry
        "C|user|q|b|rid|now", the pending record "P|q|oid|user|now" and the
        bought record "B|q|oid|b|0"
        Events with holds (hold_seconds) add, after the n groups, n queue
        entries "pay_by|oid"; their stream records end "|pay_by" and their
        index entries are "H|user|q|b|rid|now|pay_by" (built by the caller).
        Without these values (and KEYS[11..13]) the script runs as it always
        did.

Returns "ST" when the bucket does not exist or is sealed, else a flat array of
2n values, two per entry, in order:
  "B", stock_left   bought: decremented, order in stream + index, user count up
                    (limit), record "B|q|oid|b|0" stored when keep
  "R", record       the rid has a record already: the caller replays it (or
                    re-drives the saga if it is pending "P|...")
  "L", held         over the limit; record "L|q|limit|held" when keep
  "S", left         sold out: the event was found to hold left < q units (a
                    consistent probe of every bucket) and no unit has come
                    back since (the empty mark's epoch still equals the
                    epoch); record "S|q|left" when keep
  "P", stock        fewer than q here: the quota is reserved (limit), the
                    pending record stored under rid and rid added to pend
                    (score now: the sweeper ends it if no driver does); the
                    caller probes the ring
With holds, one value more at the end: 1 when this call put the first hold
into a bucket that had none (KEYS[11] ss:{e#g#b}:holds and KEYS[13]
ss:{e#g#b}:hq both empty: the caller adds the bucket to the deadline index
ss:holds), else 0. A bought entry's queue entry is then appended to KEYS[13]
(the LIST of fast-path deadlines: one RPUSH for the call; pay-by is now +
hold_seconds, so the list is in deadline order but for clock skew between
instances) and its units added to KEYS[12] — in this same step, so an order
is never bought without its deadline, nor a deadline left without an order.
Its one stream record carries the deadline: a hold costs the hot path an
RPUSH element and an INCRBY per call, not a second XADD nor a ZSET insert.
A confirm or cancel leaves the queue entry; expire_holds.lua drops it when
due.

Why one script: the limit check, the decrement, the order record and the
idempotency record must happen together. Split, two buyers could pass the same
check (oversell, or a user over the limit), or a crash could leave a unit
deducted with no order record. The stock check and the decrement of all q units
are one step, so a multi-unit order never drives a bucket negative (the DECRBY
trap of seed 003).
]]
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[6]) == 1 then
  return 'ST'
end
local n = tonumber(ARGV[3])
local stock = tonumber(redis.call('GET', KEYS[1]))
local empty = redis.call('GET', KEYS[8])
local soldout, left = false, 0
if empty then
  local epoch, l = string.match(empty, '^(%d+)|?(%d*)$')
  soldout = epoch == (redis.call('GET', KEYS[9]) or '0')
  left = tonumber(l) or 0
end
local sold, wanted = 0, 0
local out = {}
local hbase = 3 + 10 * n
local holds = #ARGV > hbase
local first, hunits, deadlines = false, 0, {}
if holds then
  first = redis.call('ZCARD', KEYS[11]) == 0 and redis.call('LLEN', KEYS[13]) == 0
end
for i = 1, n do
  local a = 3 + (i - 1) * 10
  local user, qty, limit = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local rid, keep = ARGV[a + 4], ARGV[a + 5] == '1'
  local rec = false
  if rid ~= '' then rec = redis.call('HGET', KEYS[3], rid) end
  local held = 0
  if not rec and limit > 0 then held = tonumber(redis.call('HGET', KEYS[2], user) or '0') end
  local o = 2 * i - 1
  if rec then
    out[o], out[o + 1] = 'R', rec
  elseif limit > 0 and held + qty > limit then
    if keep then
      redis.call('HSET', KEYS[3], rid, 'L|' .. qty .. '|' .. limit .. '|' .. held)
    end
    out[o], out[o + 1] = 'L', held
  elseif stock >= qty then
    wanted = wanted + qty
    stock = stock - qty
    sold = sold + qty
    if limit > 0 then redis.call('HINCRBY', KEYS[2], user, qty) end
    redis.call('XADD', KEYS[4], '*', 'd', ARGV[a + 7])
    redis.call('HSET', KEYS[5], ARGV[a + 6], ARGV[a + 8])
    if keep then
      redis.call('HSET', KEYS[3], rid, ARGV[a + 10])
    end
    if holds then
      deadlines[#deadlines + 1] = ARGV[hbase + i]
      hunits = hunits + qty
    end
    out[o], out[o + 1] = 'B', stock
  elseif soldout and stock <= left and left < qty then
    if keep then
      redis.call('HSET', KEYS[3], rid, 'S|' .. qty .. '|' .. left)
    end
    out[o], out[o + 1] = 'S', left
  else
    wanted = wanted + qty
    if limit > 0 then redis.call('HINCRBY', KEYS[2], user, qty) end
    redis.call('HSET', KEYS[3], rid, ARGV[a + 9])
    redis.call('ZADD', KEYS[10], ARGV[1], rid)
    out[o], out[o + 1] = 'P', stock
  end
end
if sold > 0 then
  redis.call('DECRBY', KEYS[1], sold)
end
if wanted > 0 then
  redis.call('INCRBY', KEYS[7], wanted)
end
if holds then
  if hunits > 0 then
    redis.call('RPUSH', KEYS[13], unpack(deadlines))
    redis.call('INCRBY', KEYS[12], hunits)
  end
  out[#out + 1] = (first and hunits > 0) and 1 or 0
end
return out
