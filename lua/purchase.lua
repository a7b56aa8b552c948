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
ARGV[3] n, the number of entries; then n groups of 8:
        user, qty, limit (0 = none), rid, keep (1 = store the outcome), order id,
        and, built by the caller so that the script only writes them: the
        stream record "o|oid|user|q|b|b|rid|now" and the index entry
        "C|user|q|b|rid|now". The records kept under rid ("B|q|oid|b|0",
        "P|q|oid|user|now", "L|…", "S|…") are joined here from the same
        strings, without formatting a number.
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

What a call costs Redis: a fixed number of commands whatever n is, but one
XADD per order — the reads in one MGET (stock, sealed, the sold-out mark and
its epoch), the request records and per-user counts asked for in one HMGET
each, and every record, index entry, count and pending id written in one
HSET / ZADD per key at the end. The entries still apply in order with
single-purchase semantics: an entry sees what the ones before it in the same
call did (a request id sent twice, a user buying twice) through the tables the
script keeps, not through Redis.

Why one script: the limit check, the decrement, the order record and the
idempotency record must happen together. Split, two buyers could pass the same
check (oversell, or a user over the limit), or a crash could leave a unit
deducted with no order record. The stock check and the decrement of all q units
are one step, so a multi-unit order never drives a bucket negative (the DECRBY
trap of seed 003).
]]
local v = redis.call('MGET', KEYS[1], KEYS[6], KEYS[8], KEYS[9])
if not v[1] or v[2] then
  return 'ST'
end
local stock = tonumber(v[1])
local soldout, left = false, 0
if v[3] then
  local epoch, l = string.match(v[3], '^(%d+)|?(%d*)$')
  soldout = epoch == (v[4] or '0')
  left = tonumber(l) or 0
end
local now, b, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local W = 8
-- Every request record and per-user count the call may read, in one HMGET each.
local rids, users = {}, {}
for i = 1, n do
  local a = 3 + (i - 1) * W
  if ARGV[a + 4] ~= '' then rids[#rids + 1] = ARGV[a + 4] end
  if ARGV[a + 3] ~= '0' then users[#users + 1] = ARGV[a + 1] end
end
local known, held = {}, {}
if #rids > 0 then
  local got = redis.call('HMGET', KEYS[3], unpack(rids))
  for j = 1, #rids do
    if got[j] then known[rids[j]] = got[j] end
  end
end
if #users > 0 then
  local got = redis.call('HMGET', KEYS[2], unpack(users))
  for j = 1, #users do
    held[users[j]] = tonumber(got[j] or '0')
  end
end
local recs, index, pend, counted = {}, {}, {}, {}
local function keep_record(rid, rec)
  known[rid] = rec
  recs[#recs + 1] = rid
  recs[#recs + 1] = rec
end
local function count(user, qty)
  if not counted[user] then
    counted[user] = true
    counted[#counted + 1] = user
  end
  held[user] = held[user] + qty
end
local sold, wanted = 0, 0
local out = {}
local hbase = 3 + W * n
local holds = #ARGV > hbase
local first, hunits, deadlines = false, 0, {}
if holds then
  first = redis.call('ZCARD', KEYS[11]) == 0 and redis.call('LLEN', KEYS[13]) == 0
end
for i = 1, n do
  local a = 3 + (i - 1) * W
  local user, qs, ls = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local qty, limit = tonumber(qs), tonumber(ls)
  local rid, keep, oid = ARGV[a + 4], ARGV[a + 5] == '1', ARGV[a + 6]
  local rec = rid ~= '' and known[rid]
  local o = 2 * i - 1
  if rec then
    out[o], out[o + 1] = 'R', rec
  elseif limit > 0 and held[user] + qty > limit then
    if keep then keep_record(rid, 'L|' .. qs .. '|' .. ls .. '|' .. held[user]) end
    out[o], out[o + 1] = 'L', held[user]
  elseif stock >= qty then
    wanted = wanted + qty
    stock = stock - qty
    sold = sold + qty
    if limit > 0 then count(user, qty) end
    redis.call('XADD', KEYS[4], '*', 'd', ARGV[a + 7])
    index[#index + 1] = oid
    index[#index + 1] = ARGV[a + 8]
    if keep then keep_record(rid, 'B|' .. qs .. '|' .. oid .. '|' .. b .. '|0') end
    if holds then
      deadlines[#deadlines + 1] = ARGV[hbase + i]
      hunits = hunits + qty
    end
    out[o], out[o + 1] = 'B', stock
  elseif soldout and stock <= left and left < qty then
    if keep then keep_record(rid, 'S|' .. qs .. '|' .. left) end
    out[o], out[o + 1] = 'S', left
  else
    wanted = wanted + qty
    if limit > 0 then count(user, qty) end
    keep_record(rid, 'P|' .. qs .. '|' .. oid .. '|' .. user .. '|' .. now)
    pend[#pend + 1] = now
    pend[#pend + 1] = rid
    out[o], out[o + 1] = 'P', stock
  end
end
if #recs > 0 then
  redis.call('HSET', KEYS[3], unpack(recs))
end
if #index > 0 then
  redis.call('HSET', KEYS[5], unpack(index))
end
if #pend > 0 then
  redis.call('ZADD', KEYS[10], unpack(pend))
end
if #counted > 0 then
  local counts = {}
  for j = 1, #counted do
    counts[2 * j - 1] = counted[j]
    counts[2 * j] = held[counted[j]]
  end
  redis.call('HSET', KEYS[2], unpack(counts))
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
