--[[ purchase.lua — the HOME step: the fast path of a purchase, for a batch of
entries that share one home bucket, applied in order.

KEYS[1] ss:{e#g#b}:stock   remaining units (string integer); missing = no such bucket
KEYS[2] ss:{e#g#b}:users   HASH user -> units held (bought + reserved), users homed
                           here; kept only for events with a per-user limit
KEYS[3] ss:{e#g#b}:reqs    HASH request id -> outcome record
KEYS[4] ss:{e#g#b}:orders  STREAM of order records: what this script buys, one entry
                           per call (per run of buyers between replays) with a
                           field per order, its order id = its index entry
                           (domain::stream: the flusher reads them as records
                           of kind o, home and bucket b)
KEYS[5] ss:{e#g#b}:idx     HASH order id -> order entry "C|user|q|b|rid|t"
KEYS[6] ss:{e#g#b}:sealed  exists once the bucket is sealed (closed, resharded)
KEYS[7] ss:{e#g#b}:demand  units asked for by buyers homed here (the rebalancer's signal)
KEYS[8] ss:{e#g#b}:empty   "epoch|left": at that epoch the whole event was found
                           to hold at most left units (older marks: "epoch", none)
KEYS[9] ss:{e#g#b}:epoch   bumped (on every bucket) whenever units come back to a
                           sold-out event; the empty mark holds only while equal
KEYS[10] ss:{e#g#b}:pend   ZSET request ids of sagas pending here -> start ms
KEYS[11] ss:{e#g#b}:holds  ZSET order id -> pay-by ms (events with holds only)
KEYS[12] ss:{e#g#b}:hunits units in live holds (events with holds only)
KEYS[13] ss:{e#g#b}:hq     LIST of fast-path deadlines (events with holds only)
KEYS[14] ss:{e#g#b}:tok    HASH access tokens of users homed here ("token" events
                           only, which pass KEYS[11..13] too): "t:<token id>" ->
                           units of its allowance taken (bought, or reserved by
                           sagas in flight), "r:<token id>" -> of those, units
                           reserved by sagas in flight, "s:<rid>" -> the token
                           id a pending saga reserved (finish.lua settles it)
ARGV[1] now (unix ms)
ARGV[2] b, this bucket's index
ARGV[3] n, the number of entries
ARGV[4] uniform: "1" when every entry keeps its outcome (a client request id), the n
        request ids are distinct and, with a limit, so are the n users (the
        caller checks): the call may then buy all n in one pass; else "0"
ARGV[5] limit: the per-user limit of every entry (0 = none) when ARGV[4] is "1"
ARGV[6] total: the n quantities' sum
ARGV[7] limit_format: an over-limit refusal's record with its three numbers
        (qty, limit, units held) as %s, for string.format
        (domain::model::RequestRecord::refusal_formats)
ARGV[8] sold_out_format: a sold-out refusal's record with its two numbers
        (qty, units left) as %s
then columns of n (i = 1..n), built by the caller so that the script only
compares and writes them, laid out so that a call that buys everything
writes each key with one command of consecutive arguments (unpack of a
range of ARGV: no Lua table, no string built):
  ARGV[8 + 2i - 1] rid                 request id
  ARGV[8 + 2i] record                  its record if bought on the fast path
                                        "B|q|oid|b|0"
  ARGV[8 + 2n + 2i - 1] order          order id
  ARGV[8 + 2n + 2i] entry              its index entry "C|user|q|b|rid|now"
                                        (its stream record too: the pair is
                                        the order's field in the stream entry)
  only when ARGV[4] is "0" or ARGV[5] is not "0" (a call that may need
  them on its fast path: to check and count each user's units):
  ARGV[8 + 4n + i] user
  ARGV[8 + 5n + i] qty
  only when ARGV[4] is "0":
  ARGV[8 + 6n + i] limit               (0 = none)
  ARGV[8 + 7n + i] keep                (1 = store the outcome)
  ARGV[8 + 8n + i] pending             its pending record "P|q|oid|user|now"
                                        (domain::model::RequestRecord), stored
                                        as given if the entry is short here
  only with holds, always the last column (so at 8 + 4n + i without the
  five above, 8 + 6n + i without limit, keep and pending):
  ARGV[8 + 9n + i] queue               the hold's queue entry "pay_by|oid"
  only for "token" events (KEYS[14] given; a uniform call's token ids are
  distinct too, the caller checks), always after every other column (so
  from 8 + 9n without holds), for a token the engine checked (signature,
  user, expiry) the name of its taken counter in KEYS[14], built by the
  caller so that the fast path neither parses nor concatenates, its
  allowance and the entry's quantity; for a token the engine refused,
  "!<why>", 0 and the quantity:
  ARGV[8 + 10n + i] taken              "t:<token id>", or "!<why>"
  ARGV[8 + 11n + i] allowance          units the token buys in all (0: refused)
  ARGV[8 + 12n + i] units              the entry's quantity (as the qty column)
  Without the user and qty columns (the common call: request ids, no
  limit), a path that needs them reads them from the entry's index entry
  (its second and third fields; a user id holds no "|"): a call that buys
  everything needs neither, and so carries four values an entry, not six;
  one with replays matches the quantity of each of its entries, and the
  entry-by-entry path both.
n is at most 1000 (batching.max_batch's bound, checked by the settings): no
unpack below spans more than 2n values, well under the ~8000 Lua's C stack
takes (purchase_groups.lua copies a group's arguments without unpack).
Events with holds (hold_seconds) add a last column: n queue entries
"pay_by|oid"; their index entries (and so their stream records) are
"H|user|q|b|rid|now|pay_by" (built by the caller). Without it (and
KEYS[11..13]) the script runs as it always did.

Returns "ST" when the bucket does not exist or is sealed; "A", left when
every entry bought (none replayed: the common call), left being the bucket's
stock after the last of them (the caller knows each entry's quantity, so
each one's stock left too: a reply of two values instead of 2n, and no
per-entry number parsed); else a flat array of 2n values, two per entry, in
order:
  "B", stock_left   bought: decremented, order in stream + index, user count up
                    (limit), record "B|q|oid|b|0" stored when keep
  "R", record       the rid has a record already: the caller replays it (or
                    re-drives the saga if it is pending "P|...")
  "L", held         over the limit; record ARGV[7] filled with q, limit, held
                    when keep
  "S", left         sold out: the event was found to hold left < q units (a
                    consistent probe of every bucket) and no unit has come
                    back since (the empty mark's epoch still equals the
                    epoch); record ARGV[8] filled with q, left when keep
  "P", stock        fewer than q here: the quota is reserved (limit), the
                    pending record stored under rid and rid added to pend
                    (score now: the sweeper ends it if no driver does); the
                    caller probes the ring
  "K", why          "token" events: a fresh request id whose token the engine
                    refused (why: its code), or whose allowance is spent
                    ("used": units bought plus reserved plus q over it);
                    nothing written. A known request id answers "R" first:
                    a replay never checks the token again.
A uniform call that cannot buy every entry answers {"W"} instead, having
changed nothing, unless every entry is surely refused sold out: it carries
no pending records, and the caller sends it again with every column (as a
call that is not uniform). Only a call whose bucket is short pays that
second call, and it probes the ring next anyway.
With holds, one value more at the end (of "A", left too): 1 when this call put the first hold
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

What a call costs Redis. Most calls buy every entry they carry, but for
replays and, with a limit, entries over it (fresh request ids, stock left):
after one MGET (stock, sealed, the sold-out mark and its epoch) and one
HMGET of the request records (and one of the per-user counts, with a
limit), they write with one XADD (an entry holding every order of the run:
field order id, value its index entry, the same arguments as the index's
HSET) and one HSET per hash for each run of buyers between the entries
that do not buy, one DECRBY / INCRBY for the whole call, with a limit one
HSET of the buyers' new counts (an HINCRBY each cost 5–7% more
instructions a purchase) and an "L|…" record for each entry over it (a
uniform call's users are distinct, so its entries' limits are independent
of each other: before, one repeat buyer sent the whole call entry by
entry). One that buys every entry answers "A", left, not two values an
entry (measured with bench/callgrind/script_cost.sh, one group of 11 and of
40: 32,952 and 27,392 instructions a purchase before, 27,279 and 21,470
after, most of it the reply's 2n values and a quantity parsed per entry).
The HMGET asks for the n request ids only (a table of n references built
for it: it had asked for the 2n values of the request id column, records
too, to unpack one range, each a needless probe of a large hash), and a
call without a limit carries no user nor quantity column: 26,940 → 24,564
and 21,095 → 18,638 instructions a purchase for the same two calls (with a
limit, 37,300 → 37,051; eight groups of two, 60,578 → 58,414).
Any other call — a sold-out refusal, a bucket short of stock, entries
without request ids, a request id or (with a limit) a user twice — runs
entry by entry, each seeing what the ones before it did, with the records
the fast path would have written (a refusal's: the caller's format, filled
here with the number only the script knows; the pending record "P|…" the
caller's column: domain/ encodes every one, the script assembles none). Lua tables and strings built per entry cost more than
the commands they save (every allocation feeds the script GC), so the
per-entry path uses none.

Access tokens ("token" events): the token's allowance is checked and
consumed here, with the take, on the user's home slot (checked in a step of
its own before the take, a one-unit token buys twice: docs/DESIGN.md, "Fair
drops"). Bought adds q to "t:<id>" in the step that writes the order; a
pending saga adds q to "t:<id>" and to "r:<id>" and links "s:<rid>" to the
token, and finish.lua takes it off "r:<id>" with the order or off both when
it gives it back, so the check reads one field a token. An open event's call
carries no KEYS[14] and pays one lookup. A uniform call (distinct token ids)
checks every token with one HMGET of the "t:" counts and writes the buyers'
new counts with one HSET, so token purchases share the call's one XADD as
open ones do: entry by entry, a token purchase cost 1.42x the CPU of an open
one over HTTP (BENCHMARKS.md, "Fair drops"), one XADD and three hash
commands each. The caller sends each token's field name as a column: built
here from one "<allowance>|<id>" column (a match and two concatenations an
entry), the script cost Redis 30.8 us a purchase against an open one's 17.2.

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
local now, b, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local uniform, limit = ARGV[4] == '1', tonumber(ARGV[5])
local fast = uniform
local R, O, U, Q = 8, 8 + 2 * n, 8 + 4 * n, 8 + 5 * n
local L, K, PN = 8 + 6 * n, 8 + 7 * n, 8 + 8 * n
local cols = not uniform or limit > 0
local hbase = not cols and U or uniform and L or 8 + 9 * n
local tok = KEYS[14]
local holds = #ARGV > hbase + (tok and 3 * n or 0)
local T = holds and hbase + n or hbase
-- Without the columns, an entry's quantity and user are matched in its index
-- entry (inline: a helper function would be a closure and upvalues made per
-- call, more than the matches cost). A quantity's string is one Lua has
-- already, so matching it allocates nothing.
local QP, UP = '^%a|[^|]*|(%d+)|', '^%a|([^|]*)|'
local stock = tonumber(v[1])
local out = {}

-- Every entry buys, replays or is over the limit: one read of the request
-- records (and of the counts), then every write once per key (once per run
-- of buyers between the entries that do not buy).
if fast then
  local rids = {}
  for i = 1, n do
    rids[i] = ARGV[R + 2 * i - 1]
  end
  local got = redis.call('HMGET', KEYS[3], unpack(rids))
  local replays = 0
  for i = 1, n do
    if got[i] then
      replays = replays + 1
    end
  end
  -- With a limit, an entry over it is refused here as it would be entry by
  -- entry (the call's users are distinct: no entry's count depends on
  -- another's), so one repeat buyer does not send the whole call down the
  -- slow path: over[i] is its user's count, its answer "L", held.
  local held, over, refused = nil, nil, 0
  -- A token event: an entry's token refused by the engine ("!why") or with
  -- too little allowance left is refused here as entry by entry, over[i]
  -- its code (answer "K"), before the limit as there; a buyer's new count
  -- of units taken is tn[i] (under its taken column's field). The call's
  -- token ids are distinct (the caller checks), so no entry's allowance
  -- depends on another's: one HMGET of every token's taken count (the
  -- column as it is: a refused entry's "!why" is a field no token has),
  -- one HSET of the buyers' new counts.
  local tn
  if tok and replays < n then
    tn = {}
    local c = redis.call('HMGET', tok, unpack(ARGV, T + 1, T + n))
    for i = 1, n do
      if not got[i] then
        local allowance = tonumber(ARGV[T + n + i])
        if allowance == 0 then
          over = over or {}
          over[i] = string.sub(ARGV[T + i], 2)
          refused = refused + 1
        else
          local taken = tonumber(c[i] or '0') + tonumber(ARGV[T + 2 * n + i])
          if taken > allowance then
            over = over or {}
            over[i] = 'used'
            refused = refused + 1
          else
            tn[i] = taken
          end
        end
      end
    end
  end
  if limit > 0 and replays + refused < n then
    held = redis.call('HMGET', KEYS[2], unpack(ARGV, U + 1, U + n))
    for i = 1, n do
      if not got[i] and not (over and over[i]) then
        local h = tonumber(held[i] or '0')
        if h + tonumber(ARGV[Q + i]) > limit then
          over = over or {}
          over[i] = h
          refused = refused + 1
        end
      end
    end
  end
  local skips = replays + refused
  local want = 0
  if skips == 0 then
    want = tonumber(ARGV[6])
  else
    for i = 1, n do
      if not got[i] and not (over and over[i]) then
        want = want + tonumber(cols and ARGV[Q + i] or string.match(ARGV[O + 2 * i], QP))
      end
    end
  end
  fast = stock >= want
  if fast then
    local first = skips < n and holds and redis.call('ZCARD', KEYS[11]) == 0
      and redis.call('LLEN', KEYS[13]) == 0
    -- Every entry buys (the common call): each key written once, and one
    -- reply for the call instead of two values an entry.
    if skips == 0 then
      redis.call('XADD', KEYS[4], '*', unpack(ARGV, O + 1, O + 2 * n))
      if limit > 0 then
        -- Each user's new count in one HSET, not an HINCRBY each: the call's
        -- users are distinct (uniform), their counts were just read, and a
        -- first purchase's count is its quantity's own string.
        local counts = {}
        for k = 1, n do
          local q = ARGV[Q + k]
          counts[2 * k - 1], counts[2 * k] = ARGV[U + k], held[k] and tonumber(held[k]) + tonumber(q) or q
        end
        redis.call('HSET', KEYS[2], unpack(counts))
      end
      if tn then
        local counts = {}
        for k = 1, n do
          counts[2 * k - 1], counts[2 * k] = ARGV[T + k], tn[k]
        end
        redis.call('HSET', tok, unpack(counts))
      end
      redis.call('HSET', KEYS[5], unpack(ARGV, O + 1, O + 2 * n))
      redis.call('HSET', KEYS[3], unpack(ARGV, R + 1, R + 2 * n))
      redis.call('DECRBY', KEYS[1], ARGV[6])
      redis.call('INCRBY', KEYS[7], ARGV[6])
      if holds then
        redis.call('RPUSH', KEYS[13], unpack(ARGV, hbase + 1, hbase + n))
        redis.call('INCRBY', KEYS[12], ARGV[6])
        return {'A', stock - want, first and 1 or 0}
      end
      return {'A', stock - want}
    end
    -- An entry that does not buy: its answer, and an over-limit one's record.
    local function skip(i)
      if got[i] then
        out[2 * i - 1], out[2 * i] = 'R', got[i]
      elseif type(over[i]) == 'string' then
        out[2 * i - 1], out[2 * i] = 'K', over[i]
      else
        local h = over[i]
        redis.call('HSET', KEYS[3], ARGV[R + 2 * i - 1], string.format(ARGV[7], ARGV[Q + i], ARGV[5], h))
        out[2 * i - 1], out[2 * i] = 'L', h
      end
    end
    if skips == n then
      for i = 1, n do
        skip(i)
      end
      if holds then
        out[2 * n + 1] = 0
      end
      return out
    end
    local i, counts, tcounts = 1, limit > 0 and {}, tn and {}
    while i <= n do
      if got[i] or over and over[i] then
        skip(i)
        i = i + 1
      else
        local j = i
        while j < n and not got[j + 1] and not (over and over[j + 1]) do
          j = j + 1
        end
        redis.call('XADD', KEYS[4], '*', unpack(ARGV, O + 2 * i - 1, O + 2 * j))
        for k = i, j do
          stock = stock - tonumber(cols and ARGV[Q + k] or string.match(ARGV[O + 2 * k], QP))
          out[2 * k - 1], out[2 * k] = 'B', stock
          if counts then
            local q = ARGV[Q + k]
            counts[#counts + 1] = ARGV[U + k]
            counts[#counts + 1] = held[k] and tonumber(held[k]) + tonumber(q) or q
          end
          if tcounts then
            tcounts[#tcounts + 1] = ARGV[T + k]
            tcounts[#tcounts + 1] = tn[k]
          end
        end
        redis.call('HSET', KEYS[5], unpack(ARGV, O + 2 * i - 1, O + 2 * j))
        redis.call('HSET', KEYS[3], unpack(ARGV, R + 2 * i - 1, R + 2 * j))
        if holds then
          redis.call('RPUSH', KEYS[13], unpack(ARGV, hbase + i, hbase + j))
        end
        i = j + 1
      end
    end
    if counts then
      redis.call('HSET', KEYS[2], unpack(counts))
    end
    if tcounts then
      redis.call('HSET', tok, unpack(tcounts))
    end
    redis.call('DECRBY', KEYS[1], want)
    redis.call('INCRBY', KEYS[7], want)
    if holds then
      redis.call('INCRBY', KEYS[12], want)
      out[2 * n + 1] = first and 1 or 0
    end
    return out
  end
end

-- Entry by entry: replays, refusals, pending sagas, or entries of mixed kinds.
local soldout, left = false, 0
if v[3] then
  local epoch, l = string.match(v[3], '^(%d+)|?(%d*)$')
  soldout = epoch == (v[4] or '0')
  left = tonumber(l) or 0
end
if uniform then
  -- No pending records in this call: ask for them, before any write,
  -- unless no entry can end pending (the sold-out mark refuses every one:
  -- stock only falls, so none buys and none is short of more than left).
  local pend = not soldout or stock > left
  for i = 1, n do
    if pend then break end
    pend = tonumber(cols and ARGV[Q + i] or string.match(ARGV[O + 2 * i], QP)) <= left
  end
  if pend then return {'W'} end
end
local sold, wanted = 0, 0
local first, hunits, deadlines = false, 0, {}
if holds then
  first = redis.call('ZCARD', KEYS[11]) == 0 and redis.call('LLEN', KEYS[13]) == 0
end
for i = 1, n do
  local rid, brec = ARGV[R + 2 * i - 1], ARGV[R + 2 * i]
  local oid = ARGV[O + 2 * i - 1]
  local user = cols and ARGV[U + i] or string.match(ARGV[O + 2 * i], UP)
  local qs = cols and ARGV[Q + i] or string.match(ARGV[O + 2 * i], QP)
  local qty = tonumber(qs)
  local ls, keep = ARGV[5], true
  if not uniform then
    ls, keep = ARGV[L + i], ARGV[K + i] == '1'
  end
  local lim = tonumber(ls)
  local rec = false
  if rid ~= '' then rec = redis.call('HGET', KEYS[3], rid) end
  local held = 0
  if not rec and lim > 0 then held = tonumber(redis.call('HGET', KEYS[2], user) or '0') end
  -- A token event: the token's refusal, or (tid) its allowance holds q.
  local refused, tid = false, false
  if tok and not rec then
    local allowance = tonumber(ARGV[T + n + i])
    if allowance == 0 then
      refused = string.sub(ARGV[T + i], 2)
    else
      if tonumber(redis.call('HGET', tok, ARGV[T + i]) or '0') + qty > allowance then
        refused = 'used'
      else
        tid = true
      end
    end
  end
  local o = 2 * i - 1
  if rec then
    out[o], out[o + 1] = 'R', rec
  elseif refused then
    out[o], out[o + 1] = 'K', refused
  elseif lim > 0 and held + qty > lim then
    if keep then
      redis.call('HSET', KEYS[3], rid, string.format(ARGV[7], qs, ls, held))
    end
    out[o], out[o + 1] = 'L', held
  elseif stock >= qty then
    wanted = wanted + qty
    stock = stock - qty
    sold = sold + qty
    if lim > 0 then redis.call('HINCRBY', KEYS[2], user, qs) end
    redis.call('XADD', KEYS[4], '*', oid, ARGV[O + 2 * i])
    redis.call('HSET', KEYS[5], oid, ARGV[O + 2 * i])
    if keep then
      redis.call('HSET', KEYS[3], rid, brec)
    end
    if tid then
      redis.call('HINCRBY', tok, ARGV[T + i], qty)
    end
    if holds then
      deadlines[#deadlines + 1] = ARGV[hbase + i]
      hunits = hunits + qty
    end
    out[o], out[o + 1] = 'B', stock
  elseif soldout and stock <= left and left < qty then
    if keep then
      redis.call('HSET', KEYS[3], rid, string.format(ARGV[8], qs, left))
    end
    out[o], out[o + 1] = 'S', left
  else
    wanted = wanted + qty
    if lim > 0 then redis.call('HINCRBY', KEYS[2], user, qs) end
    redis.call('HSET', KEYS[3], rid, ARGV[PN + i])
    redis.call('ZADD', KEYS[10], now, rid)
    if tid then
      -- Taken, and of it reserved: finish.lua ends the reservation. The
      -- link names the token's id: its taken field past "t:".
      local id = string.sub(ARGV[T + i], 3)
      redis.call('HINCRBY', tok, ARGV[T + i], qty)
      redis.call('HINCRBY', tok, 'r:' .. id, qty)
      redis.call('HSET', tok, 's:' .. rid, id)
    end
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
