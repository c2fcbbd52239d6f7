-- slidegate: sliding window log, one atomic decision over several keys (all or nothing).
-- (One key goes through sliding_log.lua, which is leaner; both write the same entries.)
--
-- KEYS[i]     key i's sorted set: score = admission time (ms); member = '<time ms>:<id>' (plus
--             ':<j>' for the j-th permit of a call admitting cost > 1), unique per admitted permit
-- ARGV[1]     id: unique per call across all clients (the client's random id + a counter)
-- ARGV[2]     now in ms, or "" for Redis' own TIME (so application servers with skewed clocks
--             share one window; scripts replicate their effects since Redis 5, so reading TIME
--             before a write is allowed)
-- ARGV[3i..3i+2]  key i's limit, window in ms, cost (1 <= cost <= limit, checked by the caller;
--             keys are distinct, checked by the caller)
-- Returns     {admitted 0|1, then per key: fits 0|1, remaining, reset_after_ms, retry_after_ms or -1}
--             When one key does not fit, nothing is written anywhere; a key that fit is reported
--             with fits = 1 and its uncharged remaining.
-- Cluster     every key of one call must hash to one slot (the caller checks).
--
-- An entry with score <= now - window has left the window. Entries are sorted by score, so the
-- expired ones are a prefix of the set. With n entries, admission needs the k = n + cost - limit
-- oldest ones gone; that is true iff the k-th oldest has expired. So evaluating a key costs ZCARD
-- and at most one ZRANGE and writes nothing, and that same k-th entry is the one a retry must
-- wait for.
local now_s = ARGV[2]
-- Expiry runs on Redis' clock; a caller's clock gets a minute of slack (see sliding_log.lua).
local ttl_slack = 60000
if now_s == '' then
  ttl_slack = 0
  local t = redis.call('TIME')
  now_s = t[1] .. string.sub('00000' .. t[2], -6, -4)
end
local now = tonumber(now_s)
local id = now_s .. ':' .. ARGV[1]

local count, blocking = {}, {}
local admitted = 1
for i = 1, #KEYS do
  local limit, window, cost = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local n = redis.call('ZCARD', KEYS[i])
  local k = n + cost - limit
  count[i] = n
  if k > 0 then
    local t = tonumber(redis.call('ZRANGE', KEYS[i], k - 1, k - 1, 'WITHSCORES')[2])
    if t > now - window then
      blocking[i] = t
      admitted = 0
    end
  end
end

local out = {admitted}
for i = 1, #KEYS do
  local key = KEYS[i]
  local limit, window, cost = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local edge = now - window
  local n = count[i]
  if admitted == 1 then
    local live = n - redis.call('ZREMRANGEBYSCORE', key, '-inf', edge)
    if cost == 1 then
      redis.call('ZADD', key, now_s, id)
    else
      local args = {}
      for j = 1, cost do
        args[2 * j - 1] = now_s
        args[2 * j] = id .. ':' .. j
      end
      redis.call('ZADD', key, unpack(args))
    end
    redis.call('PEXPIRE', key, window + ttl_slack)
    out[4 * i - 2], out[4 * i - 1], out[4 * i], out[4 * i + 1] = 1, limit - live - cost, window, -1
  else
    -- Read-only: the live count and the newest entry. Expired entries sit before the blocking
    -- one; when it is the oldest (k == 1) there are none.
    local expired = 0
    if n > 0 and not (blocking[i] and n + cost - limit == 1) then
      expired = redis.call('ZCOUNT', key, '-inf', edge)
    end
    local live, reset = n - expired, 0
    if live > 0 then
      reset = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) + window - now
    end
    local fits, retry = 1, -1
    if blocking[i] then
      fits, retry = 0, blocking[i] + window - now
    end
    out[4 * i - 2], out[4 * i - 1], out[4 * i], out[4 * i + 1] = fits, limit - live, reset, retry
  end
end
return out
