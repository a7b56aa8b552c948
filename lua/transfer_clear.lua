--[[ transfer_clear.lua — closes a transfer's journal entry in its source bucket.

KEYS[1] ss:{e#g#a}:stock (existence)   KEYS[2] ss:{e#g#a}:xfer   KEYS[3] ss:{e#g#a}:fence
ARGV[1] token: fencing token   ARGV[2] xid: transfer id
ARGV[3] open: the open entry "target|units|token|o" as the caller read it ('' when
        it read none)   ARGV[4] done: that entry's tombstone "…|d"
        (domain::transfer::OutEntry), stored as given

Returns "ST", {"F", highest}, {"D", units} (no open entry: unknown or already
done), {"A", units} (entry ARGV[3] replaced by ARGV[4]) or {"CH"} (the entry
is open but not the one the caller read: nothing changed, it reads again).
The caller reads the entry first (transfers are off the purchase path), so
the tombstone is its record, compared and stored here, never assembled.
Called only after IN succeeded. The entry is kept as a tombstone rather than
deleted, so a late duplicate OUT with the same transfer id is refused instead
of journaling the units a second time; once the fence passes its token (a
newer mover), the fence refuses that OUT first and the tombstone is dropped
(here, in transfer_out.lua or raise_fence.lua, whichever raises the fence).
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
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
if not seen then
  return {'D', '0'}
end
local units, state = string.match(seen, '^[^|]*|([^|]*)|[^|]*|(%a)$')
if state ~= 'o' then
  return {'D', units}
end
if seen ~= ARGV[3] then
  return {'CH'}
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
return {'A', units}
