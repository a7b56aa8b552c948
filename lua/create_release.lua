--[[ create_release.lua — stores a release's spec unless one is stored.

KEYS[1] ss:{r#<release>}:spec  STR the release's spec (domain::release::ReleaseSpec)
ARGV[1] spec: the spec, encoded by the engine

Returns {"OK"} (stored) or {"EX", spec} (a spec was stored: that one stays).

One script so that two creators of one release agree on its spec.
]]
local had = redis.call('GET', KEYS[1])
if had then
  return {'EX', had}
end
redis.call('SET', KEYS[1], ARGV[1])
return {'OK'}
