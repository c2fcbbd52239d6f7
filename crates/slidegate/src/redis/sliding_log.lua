-- slidegate: sliding window log, one key, one atomic decision.
--
-- KEYS[1]  the key's sorted set: score = admission time (ms); member = '<time ms>:<id>' (plus
--          ':<i>' for the i-th permit of a call admitting cost > 1), unique per admitted permit
-- ARGV[1]  id: unique per call across all clients (the client's random id + a counter)
-- ARGV[2]  now in ms, or "" for Redis' own TIME (so application servers with skewed clocks
--          share one window; scripts replicate their effects since Redis 5, so reading TIME
--          before a write is allowed)
-- ARGV[3]  window in ms
-- ARGV[4]  limit - cost (1 <= cost <= limit, checked by the caller)
-- ARGV[5]  -(limit - cost + 1): the index, from the newest entry, of the entry that blocks
-- ARGV[6]  cost
-- ARGV[7]  limit
-- Returns  {allowed 0|1, remaining, reset_after_ms, retry_after_ms or -1}
-- Cluster  touches KEYS[1] only.
--
-- An entry with score <= now - window has left the window; the expired entries are a prefix of
-- the set. With n entries, cost more fit iff the k = n + cost - limit oldest have expired, i.e.
-- iff the entry at index k - 1 (= ARGV[5] from the end) is missing or expired; that entry is
-- also the one a denied request must wait for. The script is shaped by Redis' costs (measured
-- with callgrind on Redis 7.0; see BENCHMARKS.md): every redis.call has a fixed overhead, a Lua
-- number argument is formatted with %.17g, and WITHSCORES formats every score. So a denial is
-- three calls (TIME, ZRANGE, PTTL) that write nothing; the entry's time is read from its member,
-- not its score; the timestamp string (a score without formatting) is built only when admitting;
-- and the caller passes precomputed strings (ARGV[4], ARGV[5]).
local key = KEYS[1]
local now_s = ARGV[2]
local server_time = now_s == ''
local t, now
if server_time then
  t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
else
  now = tonumber(now_s)
end
local window = tonumber(ARGV[3])
local edge = now - window

local blocking = redis.call('ZRANGE', key, ARGV[5], ARGV[5])[1]
if blocking then
  blocking = tonumber(string.match(blocking, '^%d+'))
  if blocking > edge then
    -- With cost 1 a denial means the window holds `limit` or more: nothing remains.
    local remaining = 0
    if ARGV[6] ~= '1' then
      remaining = math.max(tonumber(ARGV[7]) - redis.call('ZCOUNT', key, '(' .. edge, '+inf'), 0)
    end
    local reset
    if server_time then
      -- Every admission sets the TTL to one window, so it runs out when the newest entry leaves.
      reset = redis.call('PTTL', key)
    else
      reset = tonumber(string.match(redis.call('ZRANGE', key, '-1', '-1')[1], '^%d+')) + window - now
    end
    return {0, remaining, reset, blocking + window - now}
  end
end

if server_time then
  now_s = t[1] .. string.sub('00000' .. t[2], -6, -4)
end
local live = redis.call('ZCARD', key) - redis.call('ZREMRANGEBYSCORE', key, '-inf', edge)
local member = now_s .. ':' .. ARGV[1]
if ARGV[6] == '1' then
  redis.call('ZADD', key, now_s, member)
else
  local args = {}
  for i = 1, tonumber(ARGV[6]) do
    args[2 * i - 1] = now_s
    args[2 * i] = member .. ':' .. i
  end
  redis.call('ZADD', key, unpack(args))
end
if server_time then
  redis.call('PEXPIRE', key, ARGV[3])
else
  -- Expiry runs on Redis' clock, which a caller's clock need not follow (a test's fake clock,
  -- a replay): a minute of slack keeps live entries from vanishing early. Nothing reads the
  -- TTL in this mode; it only reclaims memory.
  redis.call('PEXPIRE', key, window + 60000)
end
return {1, tonumber(ARGV[4]) - live, window, -1}
