-- The classic sliding-log rate limiter on a Redis sorted set, as it is commonly written: drop the
-- entries older than the window (ZREMRANGEBYSCORE), count what is left (ZCARD), and when under
-- the limit record this request (ZADD) and refresh the key's expiry (EXPIRE). The benchmarks in
-- bench/ measure slidegate's scripts and module against it; it is not part of slidegate.
--
-- KEYS[1]  the key's sorted set (one slot)
-- ARGV[1]  window in milliseconds
-- ARGV[2]  limit: the most admissions any window may hold
-- ARGV[3]  a token that makes the member unique (redis-benchmark's __rand_int__)
-- Returns 1 when admitted, 0 when denied; nothing else (no remaining count, no retry time).
--
-- Time is Redis' TIME, read inside the script, so a load generator that cannot compute the time
-- on its side (redis-benchmark) can drive it. Score = now in ms; member = "<s>.<us>_<token>".
-- An entry whose score is <= now - window has left the window. A denial writes nothing beyond
-- the expired entries it drops; the key expires one second after the window has passed.
local now_parts = redis.call('TIME')
local now_ms = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local window_ms = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])

redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, now_ms - window_ms)
if redis.call('ZCARD', KEYS[1]) >= limit then
  return 0
end
redis.call('ZADD', KEYS[1], now_ms, now_parts[1] .. '.' .. now_parts[2] .. '_' .. ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(window_ms / 1000) + 1)
return 1
