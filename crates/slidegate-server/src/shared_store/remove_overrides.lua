-- slidegate: remove overrides for every instance and tell them — one by its field (a delete),
-- or those lapsed by a time (a sweep).
--
-- KEYS[1]  the state hash (see push_rules.lua): its `version` counts each removal
-- KEYS[2]  the overrides hash (see set_override.lua)
-- KEYS[3]  the expiries sorted set (see set_override.lua)
-- ARGV[1]  the channel to announce each removal on
-- ARGV[2]  "del": remove the field ARGV[3];
--          "lapse": remove at most ARGV[4] of the overrides lapsed at ARGV[3] (Unix ms, the
--          sweeping instance's clock; every instance decides by its own clock in the meantime)
-- Returns  {version, JSON} per override removed, in order; empty when there was none.
-- Cluster  three keys of one hash tag, so one slot.
local problem
if ARGV[2] == 'del' then
  problem = unwritable()
else
  problem = unwritable(ARGV[3], ARGV[4])
end
if problem then
  return redis.error_reply(problem)
end
local fields
if ARGV[2] == 'del' then
  fields = {ARGV[3]}
else
  fields = redis.call('ZRANGE', KEYS[3], '-inf', ARGV[3], 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[4]))
end
local removed = {}
for _, field in ipairs(fields) do
  local old = redis.call('HGET', KEYS[2], field)
  redis.call('ZREM', KEYS[3], field)
  if old then
    redis.call('HDEL', KEYS[2], field)
    local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
    redis.call('PUBLISH', ARGV[1], '{"v":' .. version .. ',"op":"' .. ARGV[2] .. '","o":' .. old .. '}')
    table.insert(removed, {version, old})
  end
end
return removed
