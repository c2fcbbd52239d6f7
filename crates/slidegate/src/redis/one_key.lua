-- slidegate: a fixed window or a GCRA (generic cell rate algorithm), one key without warm-up,
-- one atomic decision. check.lua decides the same on the same hashes, and also groups and
-- warm-up; this script does about half of its work (BENCHMARKS.md, "Redis CPU per decision").
--
-- KEYS[1]  the key's hash. Fixed window: i = index of the window of the last admission (now /
--          window), n = permits admitted in it. GCRA: t = theoretical arrival time in µs.
-- ARGV[1]  'f' (fixed window) or 'g' (GCRA)
-- ARGV[2..4]  fixed window: window in ms, limit, cost (1 <= cost <= limit);
--          GCRA: emission interval in µs (window * 1000 / limit, rounded down), tolerance in µs
--          (burst * emission interval), cost * emission interval (1 <= cost <= burst)
-- ARGV[5]  now in ms; absent or "" for Redis' own TIME (see sliding_log.lua)
-- Returns  admitted: {remaining, reset_after_ms}; denied: {remaining, reset_after_ms,
--          retry_after_ms}. A denial writes nothing.
-- Cluster  touches KEYS[1] only.
--
-- Every value stays below 2^53 (µs since 1970 are about 2^51), so Lua's doubles hold them
-- exactly, and they are formatted with %d before they are stored.
local key, now_s = KEYS[1], ARGV[5]
local now, slack
if not now_s or now_s == '' then
  local t = redis.call('TIME')
  now, slack = t[1] * 1000 + math.floor(t[2] / 1000), 0
else
  -- Expiry runs on Redis' clock: a caller's clock gets a minute of slack (see sliding_log.lua).
  now, slack = tonumber(now_s), 60000
end

if ARGV[1] == 'f' then
  local window = tonumber(ARGV[2])
  local j = math.floor(now / window)
  local last = redis.call('HMGET', key, 'i', 'n')
  local count = 0
  if tonumber(last[1]) == j then
    count = tonumber(last[2])
  end
  -- The window ends, and the key empties, at the next multiple of the window.
  local reset = (j + 1) * window - now
  local room = ARGV[3] - ARGV[4] - count
  if room >= 0 then
    redis.call('HSET', key, 'i', string.format('%d', j), 'n', string.format('%d', count + ARGV[4]))
    redis.call('PEXPIRE', key, string.format('%d', reset + slack))
    return {room, reset}
  end
  return {math.max(ARGV[3] - count, 0), reset, reset}
end

local now_us = now * 1000
local base = math.max(tonumber(redis.call('HGET', key, 't')) or 0, now_us)
local te, tau = tonumber(ARGV[2]), tonumber(ARGV[3])
local new = base + ARGV[4]
if new - now_us <= tau then
  redis.call('HSET', key, 't', string.format('%d', new))
  -- The key is back to idle once the theoretical arrival time has passed.
  local reset = math.ceil((new - now_us) / 1000)
  redis.call('PEXPIRE', key, string.format('%d', reset + slack))
  return {math.floor((now_us + tau - new) / te), reset}
end
return {
  math.floor(math.max(now_us + tau - base, 0) / te), math.ceil((base - now_us) / 1000),
  math.ceil((new - tau - now_us) / 1000),
}
