-- wrk script (server_cost.sh): one-unit purchases of event $EVENT by random
-- users with fresh request ids, each thread on its own random sequence.
local counter = 0
local ev = os.getenv("EVENT")
local threads = 0
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
function init(args) math.randomseed(tid * 7919 + os.time()) end
function request()
  counter = counter + 1
  local u = math.random(1, 1000000)
  local body = string.format('{"user_id":"u-%d","quantity":1,"request_id":"r%d-%d-%d"}', u, tid, counter, math.random(1, 1000000000))
  return wrk.format("POST", "/v1/events/" .. ev .. "/purchases", {["content-type"] = "application/json"}, body)
end
function response(status, headers, body)
  if status ~= 201 then io.write("status " .. status .. "\n") end
end
