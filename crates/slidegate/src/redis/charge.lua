-- slidegate: a charge or a refund (src/spec.rs, "Charges and refunds") of a fixed window or a
-- GCRA, one key, one atomic step. Only the state changes here; the caller computes the key's
-- standing from what this returns, by the specification's own code. Runs with warm_up.lua
-- prepended.
--
-- KEYS[1]  the key's hash, as one_key.lua and check.lua keep it (fixed window: i = window
--          index, n = its count; GCRA: t = theoretical arrival time in µs; s = the warm-up's
--          start in ms)
-- ARGV[1]  'f' (fixed window) or 'g' (GCRA); ARGV[2] 'c' (charge) or 'r' (refund)
-- ARGV[3..5]  fixed window: window in ms, the most a key may hold (twice the limit), cost;
--          GCRA: emission interval in µs at the full limit, the most it may be ahead of now in
--          µs (twice its tolerance), cost (1 <= cost, bounded by the caller)
-- ARGV[6]  now in ms; "" for Redis' own TIME (see sliding_log.lua)
-- ARGV[7..10]  a warm-up: its period in ms (0 or absent: none), its cold share in thousandths,
--          the limit, the window in ms. A charge into an idle key starts the ramp (s = now); a
--          GCRA's permit costs window / effective limit while it runs.
-- Returns  {now ms, the state after (fixed window: the count of window now / window; GCRA: t),
--          permits recorded or given back, the window index the hash holds (-1: none), the
--          warm-up's start (0: none)}
-- Cluster  touches KEYS[1] only.
local key, now_s = KEYS[1], ARGV[6]
local now, slack
if not now_s or now_s == '' then
  local t = redis.call('TIME')
  now, slack = t[1] * 1000 + math.floor(t[2] / 1000), 0
else
  now, slack = tonumber(now_s), 60000
end
local charge, cost = ARGV[2] == 'c', tonumber(ARGV[5])
local period, cold = tonumber(ARGV[7] or '0'), tonumber(ARGV[8] or '0')
local fmt = string.format

if ARGV[1] == 'f' then
  local window, full = tonumber(ARGV[3]), tonumber(ARGV[4])
  local j = math.floor(now / window)
  local last = redis.call('HMGET', key, 'i', 'n', 's')
  local index, since = tonumber(last[1]), tonumber(last[3]) or 0
  local count = 0
  if index == j then
    count = tonumber(last[2])
  end
  local permits
  if charge then
    permits = math.min(cost, math.max(full - count, 0))
    if permits > 0 then
      -- Under warm-up the previous window tells whether the key was idle: kept a window longer.
      local ends = j + 1
      if period > 0 then
        ends = ends + 1
        if index == nil or index + 1 < j then
          since = now
          redis.call('HSET', key, 's', fmt('%d', now))
        end
      end
      redis.call('HSET', key, 'i', fmt('%d', j), 'n', fmt('%d', count + permits))
      redis.call('PEXPIRE', key, fmt('%d', ends * window - now + slack))
      index = j
    end
    return {now, count + permits, permits, index or -1, since}
  end
  permits = math.min(cost, count)
  if permits > 0 then
    redis.call('HSET', key, 'n', fmt('%d', count - permits))
  end
  return {now, count - permits, permits, index or -1, since}
end

local now_us = now * 1000
local te, ahead_max = tonumber(ARGV[3]), tonumber(ARGV[4])
local h = redis.call('HMGET', key, 't', 's')
local tat, since = tonumber(h[1]) or 0, tonumber(h[2])
local idle = tat <= now_us
if period > 0 then
  local window = tonumber(ARGV[10])
  te = math.floor(window * 1000 / warm_limit(tonumber(ARGV[9]), period, cold, since, idle, now))
end
if charge then
  local base = math.max(tat, now_us)
  local permits = math.min(cost, math.max(math.floor((now_us + ahead_max - base) / te), 0))
  if permits == 0 then
    return {now, tat, 0, -1, since or 0}
  end
  local new = base + permits * te
  if period > 0 and idle then
    since = now
    redis.call('HSET', key, 's', fmt('%d', now))
  end
  redis.call('HSET', key, 't', fmt('%d', new))
  redis.call('PEXPIRE', key, fmt('%d', math.ceil((new - now_us) / 1000) + slack))
  return {now, new, permits, -1, since or 0}
end
if idle then
  return {now, tat, 0, -1, since or 0}
end
local new = math.max(tat - cost * te, now_us)
redis.call('HSET', key, 't', fmt('%d', new))
return {now, new, math.min(cost, math.ceil((tat - now_us) / te)), -1, since or 0}
