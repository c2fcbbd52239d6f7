-- slidegate: a sliding window counter, one key without warm-up, one atomic decision. check.lua
-- decides the same on the same hash, and also groups and warm-up; this script does about half
-- of its work (BENCHMARKS.md, "Redis CPU per decision"). Semantics: src/spec.rs.
--
-- KEYS[1]  the key's hash: bucket index (now / bucket ms, %d) -> permits admitted in it, never
--          0; check.lua's warm-up start 's' is ignored here
-- ARGV[1..4]  bucket ms (window / buckets, a whole number), buckets, limit, cost
--          (1 <= cost <= limit)
-- ARGV[5]  now in ms; absent or "" for Redis' own TIME (see sliding_log.lua)
-- Returns  one integer when it stays below 2^53, with base = (buckets + 2) * bucket ms + 1
--          (above any reset_after, retry_after or next_permit_after): admitted,
--          (remaining * base + reset_after_ms) * base + next_permit_after_ms; denied,
--          -1 - (((remaining * base + reset_after_ms) * base + retry_after_ms) * base +
--          next_permit_after_ms). Otherwise admitted {remaining, reset_after_ms,
--          next_permit_after_ms}, denied {remaining, reset_after_ms, retry_after_ms,
--          next_permit_after_ms}. (A table reply costs Redis thousands of instructions more than
--          an integer: see sliding_log.lua.) A denial writes nothing.
-- Cluster  touches KEYS[1] only.
--
-- The hash holds the buckets of one window and the one before (the weighted one), plus those an
-- admission finds left behind and deletes. Bucket j - n is weighted; j - n + 1 ..= j count in
-- full. One HGETALL reads them all, with no argument to build. An admission writes with
-- HINCRBY, whose answer tells whether the bucket is new: only then does the key's expiry move
-- (to one bucket after the window's end), as every later admission into the bucket would set it
-- to the same instant (on Redis' clock; on a caller's, within its slack). Products stay below
-- 2^53 (the caller checks limit * bucket ms), exact in Lua's doubles.
local key, now_s = KEYS[1], ARGV[5]
local now, slack
if not now_s or now_s == '' then
  local t = redis.call('TIME')
  now, slack = t[1] * 1000 + math.floor(t[2] / 1000), 0
else
  -- Expiry runs on Redis' clock: a caller's clock gets a minute of slack (see sliding_log.lua).
  now, slack = now_s + 0, 60000
end
-- `x + 0` parses a string once; tonumber(x) parses it twice (lua_isnumber, then lua_tonumber).
local b, n, limit, cost = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0
local floor = math.floor
local j = floor(now / b)
local r, weighted, base = now - j * b, j - n, (n + 2) * b + 1

-- One pass: the full buckets' sum, the weighted bucket's count, the counts by index (a denial
-- looks for its retry time in them), the newest counted bucket (the key holds nothing once it
-- has left), and whether any bucket has left the window altogether (an admission deletes those).
local h = redis.call('HGETALL', key)
local full, old, counts, newest, stale = 0, 0, {}, weighted, false
for f = 1, #h, 2 do
  local name = h[f]
  -- 's' is check.lua's warm-up start.
  if name ~= 's' then
    local k = name + 0
    if k >= weighted then
      local count = h[f + 1] + 0
      counts[k] = count
      if k > newest then
        newest = k
      end
      -- A bucket ahead of j (counted under another quota's bucket length) is not counted yet.
      if k == weighted then
        old = count
      elseif k <= j then
        full = full + count
      end
    else
      stale = true
    end
  end
end

local share = floor(old * (b - r) / b)
local estimate = full + share
local admit = estimate + cost <= limit
-- When remaining next grows (spec.rs): when the weighted bucket's share drops, or, when it adds
-- nothing, 1 ms after the oldest counted bucket with permits (an admission's included) becomes
-- the weighted one.
local next_ms = 0
if share > 0 then
  next_ms = math.min(floor(b * (old - share) / old) + 1, b) - r
else
  local oldest
  if admit then
    oldest = j
  end
  for k in pairs(counts) do
    if k > weighted and k <= j and (not oldest or k < oldest) then
      oldest = k
    end
  end
  if oldest then
    next_ms = (oldest + n) * b + 1 - now
  end
end
if admit then
  local reset = (j + n + 1) * b - now
  if redis.call('HINCRBY', key, string.format('%d', j), ARGV[4]) == cost then
    redis.call('PEXPIRE', key, string.format('%d', reset + slack))
  end
  if stale then
    local gone = {}
    for f = 1, #h, 2 do
      local name = h[f]
      if name ~= 's' and name + 0 < weighted then
        gone[#gone + 1] = name
      end
    end
    redis.call('HDEL', key, unpack(gone))
  end
  local remaining = limit - estimate - cost
  local packed = (remaining * base + reset) * base + next_ms
  if packed < 9007199254740992 then
    return packed
  end
  return {remaining, reset, next_ms}
end

-- Denied: the first instant the estimate leaves room for cost. In bucket k the full buckets
-- sum to `full` (later ones are empty) and the weighted one, count `old`, adds
-- floor(old * (b - r) / b), which is <= left iff r > b * (old - left - 1) / old.
local room, retry = limit - cost, 0
for k = j, j + n + 1 do
  if k > j then
    full = full - (counts[k - n] or 0)
  end
  local left = room - full
  if left >= 0 then
    local r0 = 0
    if k == j then
      r0 = r
    end
    old = counts[k - n] or 0
    if old > left then
      r0 = math.max(r0, floor(b * (old - left - 1) / old) + 1)
    end
    if r0 < b then
      retry = k * b + r0 - now
      break
    end
  end
end
local remaining, reset = math.max(limit - estimate, 0), (newest + n + 1) * b - now
local packed = ((remaining * base + reset) * base + retry) * base + next_ms
if reset < base and packed < 9007199254740992 then
  return -1 - packed
end
return {remaining, reset, retry, next_ms}
