-- slidegate: sliding window log, one key, one atomic decision.
--
-- KEYS[1]  the key's sorted set: score = admission time (ms); member = '<time ms>:<id>' (plus
--          ':<i>' for the i-th permit of a call admitting cost > 1), unique per admitted permit
-- ARGV[1]  id: unique per call across all clients (the client's random id + a counter)
-- ARGV[2]  window in ms
-- ARGV[3]  limit - cost (1 <= cost <= limit, checked by the caller)
-- ARGV[4]  the order to take: limit - cost + 1, to look first (the caller expects a denial) at
--          the entry that blocks, ARGV[3] from the newest, and the one before it; "" to count
--          the set first (it expects an admission)
-- ARGV[5]  now in ms; absent or "" for Redis' own TIME (so application servers with skewed
--          clocks share one window; scripts replicate their effects since Redis 5, so reading
--          TIME before a write is allowed)
-- ARGV[6]  cost, and ARGV[7] limit: only when cost > 1 (absent: cost 1); the caller runs this
--          script only for limits of 256 or less (counted_log.lua decides the others), which
--          bounds its work: it writes `cost` members and removes at most 256 expired ones
-- Returns  admitted: remaining * (window + 1) + next_permit_after_ms, an integer >= 0, below
--            2^53 so exact (remaining < MAX_LOG_LIMIT; reset_after is the window; no
--            retry_after). next_permit_after_ms is when the oldest entry in the window leaves.
--          denied, cost 1, window <= 94,906,264 ms (about 26 h): the integer
--            -1 - (reset_after_ms * (window + 1) + retry_after_ms), below 2^53 so exact;
--          denied otherwise: {remaining, reset_after_ms, retry_after_ms, next_permit_after_ms}.
--          The status 'COUNTED' when the key holds counted entries (see below); nothing decided.
--          A packed denial's next_permit_after is its retry_after: with cost 1 the oldest live
--          entry blocks, unless the key holds more than its limit (a limit lowered since), when
--          the table answers it.
-- Cluster  touches KEYS[1] only.
--
-- An entry with score <= now - window has left the window; the expired entries are a prefix of
-- the set. With n entries, cost more fit iff the k = n + cost - limit oldest have expired, i.e.
-- iff the entry at index k - 1 (= -(limit - cost + 1) from the end) is missing or expired;
-- that entry is also the one a denied request must wait for. An admission drops expired
-- entries (all of them from a short set, a bounded number from a long one), so a set never
-- holds more than `limit`, and it is removed whole one window after its last admission.
-- (Counting live entries with ZCOUNT instead parses every score of a listpack-encoded set
-- twice: 1.11x the classic script's instructions on keys of ~100 entries.)
--
-- The script is shaped by Redis' costs (measured with callgrind on Redis 7.0; see
-- bench/results/2026-12-01.md): every redis.call has a fixed overhead of several thousand instructions; a Lua
-- number formatted as a string (an argument to redis.call, or `..`) goes through printf's
-- %.17g / %.14g, where string.format('%d') is several times cheaper; WITHSCORES formats every
-- score; each ARGV is a string Redis builds before the script runs; and a table reply costs
-- ~5,000 instructions more than an integer (Redis probes it for err/ok/double/map/set fields
-- first). So both outcomes answer one integer, the entry's time is read from its member, not
-- its score, the timestamp string is built only when admitting, and the caller passes
-- precomputed strings. A denial writes nothing, so it cannot drop expired entries first (as the
-- classic script does); its calls and an admission's differ, and no one order is cheapest for both:
--   look first (ARGV[4] set):  denial TIME, ZRANGE, PTTL (3 calls);
--                              admission + ZCARD, ZREMRANGEBYSCORE, ZRANGE, ZADD, PEXPIRE (7)
--   count first (ARGV[4] ""):  admission TIME, ZCARD, ZREMRANGEBYSCORE, ZRANGE, ZADD, PEXPIRE
--                              (6; 4 into a new key, where there is nothing to remove or read);
--                              denial TIME, ZCARD, ZRANGE, PTTL (4)
-- An admission's ZRANGE reads the oldest entry left (its time: when remaining next grows), the
-- price of answering that in the same call: one table reply.
-- A key of counted entries (counted_log.lua: written under a limit above 256, since lowered) is
-- never decided here: every path that finds the key non-empty reads a member's time before it
-- writes (the blocking one, or the oldest left once the expired are dropped); a counted member
-- starts with a letter, so it has none, and the script answers the status 'COUNTED', for the
-- caller to run counted_log.lua instead (the expired entries it may have dropped first change
-- no count there).
-- The caller guesses the outcome from the key's last one and picks the order; a wrong guess
-- costs one call, never a different decision.
local key = KEYS[1]
local now_s = ARGV[5]
local server_time = not now_s or now_s == ''
local t, now
if server_time then
  t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
else
  now = tonumber(now_s)
end
local window = tonumber(ARGV[2])
local edge = now - window

-- The blocking entry, `room` from the newest, and the one before it: with that one, the key
-- holds more than its limit (a limit lowered since it was written), and a live entry older
-- than the blocking one may leave first.
local n, blocking, over
if ARGV[4] ~= '' then
  local got = redis.call('ZRANGE', key, ARGV[3], ARGV[4], 'REV')
  blocking, over = got[1], got[2] ~= nil
else
  n = redis.call('ZCARD', key)
  local room = tonumber(ARGV[3])
  if n > room then
    blocking, over = redis.call('ZRANGE', key, ARGV[3], ARGV[3], 'REV')[1], n > room + 1
  end
end
if blocking then
  blocking = tonumber(string.match(blocking, '^%d+'))
  if not blocking then
    return redis.status_reply('COUNTED')
  end
  if blocking > edge then
    -- With cost 1 a denial means the window holds `limit` or more: nothing remains.
    local remaining, retry = 0, blocking + window - now
    local next_ms = retry
    if ARGV[6] or over then
      local after_edge = string.format('(%d', edge)
      if ARGV[6] then
        remaining = math.max(ARGV[7] - redis.call('ZCOUNT', key, after_edge, '+inf'), 0)
      end
      local oldest = redis.call('ZRANGE', key, after_edge, '+inf', 'BYSCORE', 'LIMIT', 0, 1)[1]
      next_ms = tonumber(string.match(oldest, '^%d+')) + window - now
    end
    local reset
    if server_time then
      -- Every admission sets the TTL to one window, so it runs out when the newest entry leaves;
      -- never before the blocking one leaves (the TTL counts from Redis' command time, which
      -- can be a millisecond behind the TIME an entry was scored by).
      reset = math.max(redis.call('PTTL', key), retry)
    else
      reset = tonumber(string.match(redis.call('ZRANGE', key, '-1', '-1')[1], '^%d+')) + window - now
    end
    if not ARGV[6] and not over and window <= 94906264 and reset >= 0 and reset <= window and retry <= window then
      return -1 - (reset * (window + 1) + retry)
    end
    return {remaining, reset, retry, next_ms}
  end
end

if server_time then
  now_s = string.format('%d', now)
end
local live = n or redis.call('ZCARD', key)
-- Expired entries still at the head of the set once some are dropped (a long set's only).
local expired = 0
if live > 256 then
  -- A long set may hold many expired entries (a burst, then a pause): remove at most 256 (no
  -- fewer than the cost, at most the limit) per admission, so no call does unbounded work. The set still never holds
  -- more than `limit`: either every expired entry goes, or at least as many as are added.
  local count = redis.call('ZCOUNT', key, string.format('(%d', edge), '+inf')
  local drop = math.min(live - count, 256)
  if drop > 0 then
    redis.call('ZREMRANGEBYRANK', key, 0, drop - 1)
  end
  live, expired = count, live - count - drop
elseif live > 0 then
  live = live - redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', edge))
end
-- When remaining next grows: when the oldest entry left leaves (the new ones when none is left;
-- they are the oldest, too, when the caller's clock stepped back).
local oldest = now
if live > 0 then
  local at = '0'
  if expired > 0 then
    at = string.format('%d', expired)
  end
  local first = tonumber(string.match(redis.call('ZRANGE', key, at, at)[1], '^%d+'))
  if not first then
    return redis.status_reply('COUNTED')
  end
  oldest = math.min(first, now)
end
local member = now_s .. ':' .. ARGV[1]
if not ARGV[6] then
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
  redis.call('PEXPIRE', key, ARGV[2])
else
  -- Expiry runs on Redis' clock, which a caller's clock need not follow (a test's fake clock,
  -- a replay): a minute of slack keeps live entries from vanishing early. Nothing reads the
  -- TTL in this mode; it only reclaims memory.
  redis.call('PEXPIRE', key, string.format('%d', window + 60000))
end
return (ARGV[3] - live) * (window + 1) + oldest + window - now
