--[[ waitlist_on.lua — opens a bucket's share of a draw's waiting list.

KEYS[1] ss:{e#g#b}:stock   missing = no such bucket
KEYS[2] ss:{e#g#b}:wl      HASH the bucket's waiting list: field on

Returns "ST" (no bucket) or {"OK"}. Sets on = "1" unless the field is set
("0" once nobody is left in line: a draw redone never opens it again).
From then on expire_holds.lua, cancel.lua and confirm.lua put returned
units aside here, in the step that returns them, instead of in stock.
]]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'ST'
end
redis.call('HSETNX', KEYS[2], 'on', '1')
return {'OK'}
