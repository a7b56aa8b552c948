--[[ transfer_out.lua — OUT: takes units from a source bucket into its transfer journal.

KEYS[1] ss:{e#g#a}:stock   KEYS[2] ss:{e#g#a}:xfer   KEYS[3] ss:{e#g#a}:fence
KEYS[4] sealed flag: a sealed bucket answers "ST" (no transfer in or out)
KEYS[5] ss:{e#g#a}:adds   bumped when units leave too (see below)
ARGV[1] token: fencing token   ARGV[2] xid: transfer id   ARGV[3] units to move
ARGV[4] entry: "target|units|token|o" for those units (domain::transfer::OutEntry),
        stored as given
ARGV[5] sealed_ok: '1' when allowed on a sealed bucket (a reshard draining the old layout)

Returns:
  "ST"            bucket a does not exist
  {"F", highest}  a has accepted a higher token: the caller is a stale mover, nothing moved
  {"D", units}    this transfer id was journaled before (open or done): nothing changed
  {"A", units}    the units moved from stock into the journal entry xid -> ARGV[4]
                  ("A", 0 and no entry when the stock is 0)
  {"SH", stock}   fewer units than ARGV[3] here (but some): nothing changed; the
                  caller asks again with an entry of that many (only the
                  caller encodes journal entries)

Atomic so the units are always counted exactly once: in the stock or in the
open journal entry, never in both and never in neither. The fence check and the
raise of the fence are one step with the move. The bucket's change counter
(`adds`) is bumped as when units arrive: a reader that saw this bucket before
the OUT and the target after the IN would count the units twice, and the
audit's second collect of the counters is what tells it to read again.
Raising the fence drops the journal's tombstones below it (raise_fence.lua).
]]
if redis.call('EXISTS', KEYS[1]) == 0 or (ARGV[5] ~= '1' and redis.call('EXISTS', KEYS[4]) == 1) then
  return 'ST'
end
local token = tonumber(ARGV[1])
local fence = tonumber(redis.call('GET', KEYS[3]) or '0')
if token < fence then
  return {'F', string.format('%d', fence)}
end
if token > fence then
  redis.call('SET', KEYS[3], ARGV[1])
  -- Tombstones below the new fence answer no step any more (raise_fence.lua).
  local journal = redis.call('HGETALL', KEYS[2])
  for i = 1, #journal, 2 do
    local t, state = string.match(journal[i + 1], '^[^|]*|[^|]*|(%d+)|(%a)$')
    if state == 'd' and tonumber(t) < token then
      redis.call('HDEL', KEYS[2], journal[i])
    end
  end
end
local seen = redis.call('HGET', KEYS[2], ARGV[2])
if seen then
  return {'D', string.match(seen, '^[^|]*|([^|]*)|')}
end
local stock = tonumber(redis.call('GET', KEYS[1]))
local units = tonumber(ARGV[3])
if stock == 0 or units == 0 then
  return {'A', '0'}
end
if stock < units then
  return {'SH', string.format('%d', stock)}
end
redis.call('DECRBY', KEYS[1], units)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
redis.call('INCR', KEYS[5])
return {'A', ARGV[3]}
