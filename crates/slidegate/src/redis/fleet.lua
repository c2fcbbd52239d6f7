-- slidegate: one instance's heartbeat, and the fleet's live instances counted (local_share = "auto").
--
-- KEYS[1]  the fleet's sorted set: member = an instance's id, score = when it lapses (Redis ms)
-- ARGV[1]  this instance's id
-- ARGV[2]  how long its beat counts, in ms
-- Returns  the live instances, this one included
--
-- Lapsed members are dropped on every beat, so the set holds the instances of the last ARGV[2]
-- ms and those that stopped since; the key itself goes one lapse after the last beat.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
redis.call('ZADD', KEYS[1], string.format('%d', now + ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
