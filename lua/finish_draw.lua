--[[ finish_draw.lua — writes a draw's record once.

KEYS[1] ss:{d#<event>}:draw  HASH the draw's record: seed (hex), done
ARGV[1] done: "drawn_at|entries|winners" (domain::draw::DrawDone)

Returns the record that stands: this one, or the one written first.

A compare-and-set: two instances drawing at once (or a draw redone after
an interruption) agree on one record, and so on one drawn_at, which every
winner's token expiry is reckoned from.
]]
redis.call('HSETNX', KEYS[1], 'done', ARGV[1])
return redis.call('HGET', KEYS[1], 'done')
