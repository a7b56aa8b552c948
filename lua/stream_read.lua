--[[ stream_read.lua — the flusher's read of one bucket's order stream.

KEYS[1] ss:{e#g#b}:orders   STREAM of order ('o'), cancel ('c'), void ('v') and
                            leftover ('l') records, consumer group ARGV[1]
ARGV[1] group   ARGV[2] consumer   ARGV[3] count
ARGV[4] claim idle ms, or '' not to claim

Returns up to count entries as {id, {field, value, …}}: first, unless ARGV[4] is
'', the entries a consumer left pending (delivered, never acknowledged) for at
least ARGV[4] ms — a flusher that died mid-batch — claimed by this consumer
(XAUTOCLAIM, which scans the pending list: the flusher asks for it only every
so often per bucket), then new entries (XREADGROUP >). An entry stays pending until stream_ack.lua, so a
consumer that dies before the database commit loses nothing: its entries are
claimed again and the database insert is idempotent by stream entry id.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {}
end
local count = tonumber(ARGV[3])
local out = {}
if ARGV[4] ~= '' then
  local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[4], '0-0', 'COUNT', count)
  for _, entry in ipairs(claimed[2]) do
    out[#out + 1] = entry
  end
end
if #out < count then
  local fresh = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count - #out,
    'STREAMS', KEYS[1], '>')
  if fresh then
    for _, entry in ipairs(fresh[1][2]) do
      out[#out + 1] = entry
    end
  end
end
return out
