--[[ stream_ack.lua — acknowledges and deletes flushed entries.

KEYS[1] ss:{e#g#b}:orders   ARGV[1] group   ARGV[2…] entry ids
Returns the number of entries deleted. Called only after the database
committed them; the stream then holds exactly the records not yet in the
database, so its length is the flush lag of the bucket.
]]
local ids = {}
for i = 2, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
if #ids == 0 then
  return 0
end
redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
return redis.call('XDEL', KEYS[1], unpack(ids))
