-- slidegate: a sliding window counter, one key without warm-up, one atomic decision. check.lua
-- decides the same on the same value, and also groups and warm-up; this script does about half
-- of its work (BENCHMARKS.md, "Redis CPU per decision"). Semantics: src/spec.rs.
--
-- KEYS[1]  the key's counts, one string (docs/redis.md, "Sliding window counter"): a byte 1,
--          or 2 when check.lua's warm-up start follows (kept, not read here); the newest
--          bucket's start in ms (its index t times the bucket length), 7 bytes; [the warm-up
--          start in ms, 7 bytes]; then 4 bytes per bucket, newest first: the counts of buckets
--          t, t - 1, ... down to the oldest still counted. Integers are little-endian. A start
--          that is no multiple of the bucket length was counted under another one: the value
--          counts for nothing. A string of any other shape is an error. A hash is the earlier
--          layout (bucket index -> count, 's' the warm-up start): read as such, and rewritten as
--          the string by the first admission.
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
-- Bucket j - n is weighted; j - n + 1 ..= j count in full; an admission drops the buckets
-- before j - n. Buckets ahead of j (a caller's clock behind another's) are kept, not counted
-- yet, up to n ahead; a caller whose window does not reach the newest bucket is decided as at
-- that bucket's start, so that one limit holds across both clocks. Only an admission into a new
-- newest bucket sets the expiry (one bucket after its window ends). A value holds at most n + 1
-- counts (2n + 2 when a caller behind rewrites the earlier layout). Products stay below 2^53
-- (the caller checks limit * bucket ms), exact in Lua's doubles.
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
local r = now - j * b

-- The value as counts by age: bucket k holds u[ot - k], the counts from u[o] on (t the newest),
-- behind a head of hs bytes. A hash (the earlier layout) is laid out the same way, and
-- rewritten as a string by the first admission.
local v, t, u, o, since = redis.pcall('GET', key), j, {}, 3, nil
local legacy = type(v) == 'table'
if legacy then
  -- HGETALL fails on a key of any other type.
  local h, counts = redis.call('HGETALL', key), {}
  t = j - n
  for f = 1, #h, 2 do
    if h[f] == 's' then
      since, o = h[f + 1] + 0, 4
    else
      local k = h[f] + 0
      if k <= j + n + 1 then
        counts[k] = h[f + 1] + 0
        t = math.max(t, k)
      end
    end
  end
  u = {o - 2, t * b, since}
  for k = t, j - n, -1 do
    u[o + t - k] = counts[k] or 0
  end
  v = struct.pack((o == 3 and '<BI7' or '<BI7I7') .. string.rep('I4', #u - o + 1), unpack(u))
elseif v then
  local kind = string.byte(v)
  if kind == 2 then
    o = 4
  end
  local m = (#v - 7 * o + 13) / 4
  -- At most 2 * 100 + 2 counts (MAX_BUCKETS; the earlier layout's rewrite keeps two windows).
  if (kind ~= 1 and kind ~= 2) or m < 0 or m % 1 ~= 0 or m > 202 then
    return redis.error_reply('WRONGTYPE the key does not hold a sliding window counter')
  end
  u = {struct.unpack((o == 3 and '<BI7' or '<BI7I7') .. string.rep('I4', m), v)}
  u[#u] = nil
  t, since = u[2] / b, o == 4 and u[3] or nil
  if t % 1 ~= 0 then
    -- Counted under another bucket length: the value counts for nothing.
    v, t, u, o, since = false, j, {}, 3, nil
  end
end
-- A caller whose window does not reach the newest bucket (its clock behind another's) is
-- decided as at that bucket's start; its times are still measured from its own now.
if t > j + n then
  j, r = t, 0
end
local weighted, base, ot, hs = j - n, (n + 2) * b + 1, o + t, 7 * o - 13
-- Only buckets lo ..= t hold counts (none when the value is empty).
local lo = t - #u + o

-- The full buckets' sum, the weighted bucket's count (0 when t is older) and the newest counted
-- bucket with permits (the key holds nothing once it has left).
local full, old, newest = 0, 0, weighted
for k = math.min(t, j), math.max(weighted + 1, lo), -1 do
  full = full + u[ot - k]
end
if t >= weighted then
  old = u[ot - weighted] or 0
end
for k = t, math.max(weighted, lo), -1 do
  if u[ot - k] > 0 then
    newest = k
    break
  end
end

local share = floor(old * (b - r) / b)
local estimate = full + share
local admit = estimate + cost <= limit
-- When remaining next grows (spec.rs): when the weighted bucket's share drops, or, when it adds
-- nothing, 1 ms after the oldest counted bucket with permits (an admission's included) becomes
-- the weighted one. Times are j * b + offset - now: now may lie before bucket j (see above).
local next_ms = 0
if share > 0 then
  next_ms = j * b + math.min(floor(b * (old - share) / old) + 1, b) - now
else
  local oldest
  for k = math.max(weighted + 1, lo), math.min(t, j) do
    if u[ot - k] > 0 then
      oldest = k
      break
    end
  end
  if admit then
    oldest = math.min(oldest or j, j)
  end
  if oldest then
    next_ms = (oldest + n) * b + 1 - now
  end
end
if admit then
  -- Bucket j's count: a new newest bucket sets the value (its count, then the counts still
  -- counted behind it) with its expiry; into any other bucket the count is overwritten in
  -- place, or, when buckets before j - n are to go (or the key is the earlier hash), the value
  -- is set keeping its expiry.
  local reset, count = (j + n + 1) * b - now, cost
  if j <= t then
    count = cost + (u[ot - j] or 0)
  end
  local packed = struct.pack('<I4', count)
  if j > t or not v then
    local value
    if since then
      value = struct.pack('<BI7I7I4', 2, j * b, since, count)
    else
      value = struct.pack('<BI7I4', 1, j * b, count)
    end
    local keep = math.min(t - lo + 1, n + 1 - (j - t))
    if v and keep > 0 then
      value = value .. string.rep('\0\0\0\0', j - t - 1) .. string.sub(v, hs + 1, hs + 4 * keep)
    end
    redis.call('SET', key, value, 'PX', string.format('%d', reset + slack))
  else
    local at, ends = hs + 4 * (t - j), hs + 4 * (t - weighted + 1)
    if legacy or #v > ends then
      v = string.sub(v .. string.rep('\0', at + 4 - #v), 1, at) .. packed .. string.sub(v, at + 5, ends)
      redis.call('SET', key, v, 'KEEPTTL')
    else
      redis.call('SETRANGE', key, at, packed)
    end
  end
  local remaining = limit - estimate - cost
  local reply = (remaining * base + reset) * base + next_ms
  if reset < base and reply < 9007199254740992 then
    return reply
  end
  return {remaining, reset, next_ms}
end

-- Denied: the first instant the estimate leaves room for cost. In bucket k the full buckets
-- sum to `full` (bucket k joins it: empty, or ahead of j) and the weighted one, count `old`,
-- adds floor(old * (b - r) / b), which is <= left iff r > b * (old - left - 1) / old.
-- While the full buckets alone leave no room and none lies ahead of j, nothing changes until
-- the oldest bucket with permits (lo) becomes the weighted one: the search skips to it.
local room, retry, ahead = limit - cost, 0, t > j
local k, last = j, math.max(j, newest) + n + 1
while k <= last do
  local w = k - n
  if k > j then
    full = full - ((w <= t and u[ot - w]) or 0)
    if ahead and k <= t then
      full = full + u[ot - k]
    end
  end
  local left = room - full
  if left >= 0 then
    local r0 = 0
    if k == j then
      r0 = r
    end
    old = (w <= t and u[ot - w]) or 0
    if old > left then
      r0 = math.max(r0, floor(b * (old - left - 1) / old) + 1)
    end
    if r0 < b then
      retry = k * b + r0 - now
      break
    end
    k = k + 1
  elseif k == j and not ahead then
    k = math.max(j + 1, lo + n)
  else
    k = k + 1
  end
end
local remaining, reset = math.max(limit - estimate, 0), (newest + n + 1) * b - now
local reply = ((remaining * base + reset) * base + retry) * base + next_ms
if reset < base and reply < 9007199254740992 then
  return -1 - reply
end
return {remaining, reset, retry, next_ms}
