-- slidegate: sliding window log, one atomic decision.
--
-- KEYS[1]  the key's sorted set: score = admission time (ms), member unique per admitted permit
-- ARGV[1]  limit (1 <= cost <= limit, checked by the caller)
-- ARGV[2]  window in ms
-- ARGV[3]  cost: permits asked for
-- ARGV[4]  member: unique per call across all clients (the client's random id + a counter);
--          a call admitting cost > 1 stores member..':'..i, i = 1..cost
-- ARGV[5]  now in ms (optional). When absent the time is Redis' own TIME, so application
--          servers with skewed clocks share one window. (Scripts replicate their effects since
--          Redis 5, so reading TIME before a write is allowed.)
-- Returns  {allowed 0|1, remaining, reset_after_ms, retry_after_ms or -1}
-- Cluster  touches KEYS[1] only.
--
-- An entry with score <= now - window has left the window. Entries are sorted by score, so the
-- expired ones are a prefix of the set. With n entries, admission needs the k = n + cost - limit
-- oldest ones gone; that is true iff the k-th oldest has expired. So a denial costs ZCARD and one
-- ZRANGE and writes nothing (not even the trim), and that same k-th entry is the one a retry must
-- wait for.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now = tonumber(ARGV[5])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local edge = now - window

local n = redis.call('ZCARD', key)
local k = n + cost - limit
if k > 0 then
  local blocking = tonumber(redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')[2])
  if blocking > edge then
    -- Expired entries (fewer than k) sit before the blocking one; with k == 1 there are none.
    local expired = 0
    if k > 1 then
      expired = redis.call('ZCOUNT', key, '-inf', edge)
    end
    local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    return {0, limit - (n - expired), newest + window - now, blocking + window - now}
  end
end

local live = n - redis.call('ZREMRANGEBYSCORE', key, '-inf', edge)
if cost == 1 then
  redis.call('ZADD', key, now, ARGV[4])
else
  local args = {}
  for i = 1, cost do
    args[2 * i - 1] = now
    args[2 * i] = ARGV[4] .. ':' .. i
  end
  redis.call('ZADD', key, unpack(args))
end
redis.call('PEXPIRE', key, window)
return {1, limit - live - cost, window, -1}
