--[[ clear_markers.lua — deletes a saga's probe markers in one bucket once the
saga has ended (or was aborted, so that a retry probes afresh).

KEYS[1..n] ss:{e#g#j}:tk:<rid>:<pass> for pass = 1..n (one bucket, one slot)

Returns the number of markers deleted.

A marker "T|oid" stays: it is a take that stands (the saga's order, or units a
late driver must still give back with untake.lua, which needs the marker), and
expires with its PX. Every other marker (a short decision's hash, or an
older "S|…" string; "U|…" undone) is only a
remembered decision; without it a late driver of the ended saga decides again,
and whatever it takes, finish.lua tells it to give back. One script so that a
take landing between the read and the delete is never deleted.
]]
local n = 0
for i = 1, #KEYS do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind == 'hash' or (kind == 'string' and string.sub(redis.call('GET', KEYS[i]), 1, 1) ~= 'T') then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
