-- slidegate: a charge or a refund (src/spec.rs, "Charges and refunds") of a fixed window or a
-- GCRA without warm-up, one key, one atomic step. Only the state changes here; the caller
-- computes the key's standing from what this returns, by the specification's own code.
--
-- KEYS[1]  the key's hash, as one_key.lua keeps it (fixed window: i = window index, n = its
--          count; GCRA: t = theoretical arrival time in µs)
-- ARGV[1]  'f' (fixed window) or 'g' (GCRA); ARGV[2] 'c' (charge) or 'r' (refund)
-- ARGV[3..5]  fixed window: window in ms, the most a key may hold (twice the limit), cost;
--          GCRA: emission interval in µs, the most it may be ahead of now in µs (twice its
--          tolerance), cost (1 <= cost <= limit, checked by the caller)
-- ARGV[6]  now in ms; absent or "" for Redis' own TIME (see sliding_log.lua)
-- Returns  {now ms, the state after (fixed window: the count of window now / window; GCRA: t),
--          permits recorded or given back}
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

if ARGV[1] == 'f' then
  local window, full = tonumber(ARGV[3]), tonumber(ARGV[4])
  local j = math.floor(now / window)
  local last = redis.call('HMGET', key, 'i', 'n')
  local count = 0
  if tonumber(last[1]) == j then
    count = tonumber(last[2])
  end
  local permits
  if charge then
    permits = math.min(cost, math.max(full - count, 0))
    if permits > 0 then
      redis.call('HSET', key, 'i', string.format('%d', j), 'n', string.format('%d', count + permits))
      redis.call('PEXPIRE', key, string.format('%d', (j + 1) * window - now + slack))
    end
    return {now, count + permits, permits}
  end
  permits = math.min(cost, count)
  if permits > 0 then
    redis.call('HSET', key, 'n', string.format('%d', count - permits))
  end
  return {now, count - permits, permits}
end

local now_us = now * 1000
local te, ahead_max = tonumber(ARGV[3]), tonumber(ARGV[4])
local tat = tonumber(redis.call('HGET', key, 't')) or 0
if charge then
  local base = math.max(tat, now_us)
  local permits = math.min(cost, math.max(math.floor((now_us + ahead_max - base) / te), 0))
  if permits == 0 then
    return {now, tat, 0}
  end
  local new = base + permits * te
  redis.call('HSET', key, 't', string.format('%d', new))
  redis.call('PEXPIRE', key, string.format('%d', math.ceil((new - now_us) / 1000) + slack))
  return {now, new, permits}
end
if tat <= now_us then
  return {now, tat, 0}
end
local new = math.max(tat - cost * te, now_us)
redis.call('HSET', key, 't', string.format('%d', new))
return {now, new, math.min(cost, math.ceil((tat - now_us) / te))}
