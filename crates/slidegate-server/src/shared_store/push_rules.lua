-- slidegate: store a rules document for every instance and tell them.
--
-- KEYS[1]  the state hash (`<prefix>:{rules}:state`): `version` (one counter for every change
--          of rules and overrides), `rules` (the TOML text), `rules_version`, `pushed_at_ms`,
--          `pushed_from`
-- ARGV[1]  the TOML text (validated by the caller: `[[rules]]` and `[inline]` only)
-- ARGV[2]  the push's time, Unix ms (the pushing machine's clock: it is only reported)
-- ARGV[3]  where it was pushed from (the client's address as Redis sees it)
-- ARGV[4]  the channel to announce it on
-- Returns  {version, previous text, previous rules_version, previous pushed_at_ms, previous
--          pushed_from}, the previous ones false (nil) before the first push.
-- Cluster  one key; PUBLISH reaches every node's subscribers.
--
-- The text, its version and the announcement change together: an instance that reads the
-- state sees a whole document and the version it was stored under, never part of a push.
local problem = unwritable(ARGV[2])
if problem then
  return redis.error_reply(problem)
end
local previous = redis.call('HMGET', KEYS[1], 'rules', 'rules_version', 'pushed_at_ms', 'pushed_from')
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('HSET', KEYS[1], 'rules', ARGV[1], 'rules_version', version, 'pushed_at_ms', ARGV[2], 'pushed_from', ARGV[3])
redis.call('PUBLISH', ARGV[4], '{"v":' .. version .. ',"op":"rules"}')
return {version, previous[1], previous[2], previous[3], previous[4]}
