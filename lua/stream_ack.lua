--[[ stream_ack.lua — acknowledges flushed entries and drops what no consumer
still needs from the head of the stream.

KEYS[1] ss:{e#g#b}:orders   ARGV[1] group   ARGV[1 + i] id: the entry ids, i = 1..n
Returns the number of entries trimmed. Called only after the database
committed the entries.

The ids are acknowledged in slices of at most 1000: a read may hand out
database.flush_batch (up to 10000) entries, and Lua's unpack fails past
about 8000 values (its C stack), which left every acknowledgement of a
bucket with a longer backlog failing: the claim handed the same entries
out again for ever and a close never saw the stream drain.

The stream keeps every entry a consumer may still need: those pending
(delivered, not acknowledged: a flusher that dies before its commit loses
nothing, they are claimed again) and those not delivered yet. Everything
before the oldest of them — the group's oldest pending entry, else the entry
after its last delivered one — was delivered and acknowledged, and is
trimmed (XTRIM MINID, which drops whole nodes). XDEL of each acknowledged id
cost Redis as much as the read and the XACK together (it finds every entry
inside its node). So the stream holds the records not yet in the database,
and, until the entries before them are acknowledged too, the acknowledged
ones after a pending entry of another consumer: its length is the flush lag,
or a little more, and the audit counts a record both in the stream and in
the ledger once.
]]
if #ARGV < 2 or redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for first = 2, #ARGV, 1000 do
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
local oldest = redis.call('XPENDING', KEYS[1], ARGV[1])[2]
if not oldest then
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local name, last
    for i = 1, #group, 2 do
      if group[i] == 'name' then
        name = group[i + 1]
      elseif group[i] == 'last-delivered-id' then
        last = group[i + 1]
      end
    end
    if name == ARGV[1] then
      local ms, seq = string.match(last, '^(%d+)-(%d+)$')
      oldest = ms .. '-' .. (tonumber(seq) + 1)
    end
  end
end
if not oldest then
  return 0
end
return redis.call('XTRIM', KEYS[1], 'MINID', oldest)
