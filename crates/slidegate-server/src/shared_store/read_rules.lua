-- slidegate: the stored rules document, sent only when it is within the bound an instance reads
-- (any client of the Redis could have written one of any size there).
--
-- KEYS[1]  the state hash
-- ARGV[1]  the most bytes a document may have (MAX_DOCUMENT_BYTES)
-- Returns  {document or its length in bytes when over ARGV[1] (nil when none), rules_version,
--          pushed_at_ms, pushed_from}
local meta = redis.call('HMGET', KEYS[1], 'rules_version', 'pushed_at_ms', 'pushed_from')
local len = redis.call('HSTRLEN', KEYS[1], 'rules')
local text = len
if len <= tonumber(ARGV[1]) then
  text = redis.call('HGET', KEYS[1], 'rules')
end
return {text, meta[1], meta[2], meta[3]}
