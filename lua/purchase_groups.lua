--[[ purchase_groups.lua — the HOME step of several buckets in one call: for
each group, purchase.lua's batch of entries on that group's bucket, the
groups applied one after another in one atomic step.

Only a server that holds every key may run it: a standalone Redis (on a
Cluster each bucket has a slot of its own, so the store sends one
purchase.lua call per bucket instead). A group is exactly a purchase.lua
call: its keys, its arguments, its reply, its meaning; groups of different
buckets share nothing but the call.

KEYS              each group's purchase.lua KEYS, one group after another
                  (10 keys, 13 for events with holds, 14 for token events)
ARGV[1] g         the number of groups
ARGV[2i] keys     group i's number of keys (i = 1..g)
ARGV[2i + 1] args group i's number of arguments
then each group's purchase.lua ARGV, one group after another

Returns an array of g replies, group i's as purchase.lua answers it: "ST"
(its bucket does not exist or is sealed) or its flat array of two values an
entry (and the first-hold flag, with holds).

Why: Redis runs every script call on its one thread, and a call costs a
fixed part (the command, the script's setup, the reply, the client's
round trip) beside what its entries cost. With the batcher's lanes per
bucket, a sale of 16 buckets on one server ran ~2 purchases a call; a lane
shared by several buckets carries the entries of all of them.

purchase.lua's text takes the place of the include line below (the store
does it when it loads the scripts), as the body of `home`: its KEYS and ARGV
are the group's own tables, so its offsets, its unpack ranges and #ARGV read
as in a call of its own. An error raised by a command aborts the call, as it
would abort purchase.lua's; the caller answers every group's entries as of
unknown outcome, as it does for one.
]]
local function home(KEYS, ARGV)
--#include purchase.lua
end

-- t[from + 1 .. from + n] as a table of its own. unpack fails past about
-- 8000 values (Lua's C stack): a group of 999 entries carries ~6000
-- arguments (~8000 with holds), past it once a group had 1000 entries with
-- a limit and holds, so a longer range is copied one value at a time.
local function range(t, from, n)
  if n <= 4000 then
    return {unpack(t, from + 1, from + n)}
  end
  local out = {}
  for i = 1, n do
    out[i] = t[from + i]
  end
  return out
end

local g = tonumber(ARGV[1])
local replies = {}
local k, a = 0, 1 + 2 * g
for i = 1, g do
  local nk, na = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  replies[i] = home(range(KEYS, k, nk), range(ARGV, a, na))
  k, a = k + nk, a + na
end
return replies
