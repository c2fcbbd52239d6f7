-- slidegate: set one key's override for every instance and tell them.
--
-- KEYS[1]  the state hash (see push_rules.lua): its `version` counts this change
-- KEYS[2]  the overrides hash: field `<len(rule)>:<rule>:<key>` -> the override as JSON
-- KEYS[3]  the expiries sorted set: field -> the Unix ms it lapses at (only those that lapse)
-- ARGV[1]  the field
-- ARGV[2]  the override as JSON (written by the caller; it carries the rule and the key)
-- ARGV[3]  when it lapses, Unix ms, or "" for never
-- ARGV[4]  the most overrides there may be (a replaced one takes no room)
-- ARGV[5]  the channel to announce it on
-- Returns  {version, previous JSON or false}; {0, false} when the hash is full and the field new.
-- Cluster  three keys of one hash tag, so one slot.
local problem = unwritable(ARGV[4], ARGV[3] == '' and '0' or ARGV[3])
if problem then
  return redis.error_reply(problem)
end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 and redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[4]) then
  return {0, false}
end
local previous = redis.call('HGET', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[3], ARGV[1])
else
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
end
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('PUBLISH', ARGV[5], '{"v":' .. version .. ',"op":"set","o":' .. ARGV[2] .. '}')
return {version, previous}
