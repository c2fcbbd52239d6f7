-- slidegate: a sliding window counter, one key without warm-up, one atomic decision. check.lua
-- decides the same on the same value, and also groups and warm-up; this script does about half
-- of its work (BENCHMARKS.md, "Redis CPU per decision"). Semantics: src/spec.rs.
--
-- KEYS[1]  the key's counts, one string (docs/redis.md, "Sliding window counter"): a byte 1,
--          or 2 when check.lua's warm-up start follows (kept, not read here); the newest
--          bucket's start in ms (its index t times the bucket length), 7 bytes; [the warm-up
--          start in ms, 7 bytes]; then 4 bytes per bucket, newest first: the counts of buckets
--          t, t - 1, ... down to the oldest still counted. Integers are little-endian. A start
--          that is no multiple of the bucket length was counted under another one: all its
--          counts are taken as the bucket's holding that start. A string of any other shape, or
--          a start past MAX_CLOCK_MS, is an error. A hash is the earlier layout (bucket index ->
--          count, 's' the warm-up start): read as such. Either is rewritten as this script
--          writes it by the first admission.
-- ARGV[1..4]  bucket ms (window / buckets, a whole number), buckets, limit, cost
--          (1 <= cost <= limit)
-- ARGV[5]  now in ms; absent or "" for Redis' own TIME (see sliding_log.lua)
-- ARGV[6]  absent for a check; 'c' for a charge (src/spec.rs, "Charges and refunds": `cost`
--          recorded into bucket j as an admission, up to ARGV[7], the most the key may hold,
--          MAX_CHARGE_FACTOR times the limit) or 'r' for a refund (up to `cost` taken from the
--          fully counted buckets, newest first); either then returns {now ms, permits recorded
--          or given back, the value after (as GET returns it; "" when there is none)}, from
--          which the caller computes the key's standing by the specification's own code.
-- ARGV[8]  '1' when the quota has a warm-up: a charge into an idle key starts its ramp now (the
--          value then carries that start, a byte 2 ahead).
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
-- before j - n. A caller whose clock lies behind the newest bucket (another caller's is ahead)
-- is decided as at that bucket's start, so that one limit holds across both clocks. Only an
-- admission into a new newest bucket sets the expiry (one bucket after its window ends). A
-- value holds at most n + 1 counts (up to 2n + 2 in the earlier layout, until its first
-- admission). Products stay below 2^53 (the caller checks limit * bucket ms, and the clock
-- MAX_CLOCK_MS), exact in Lua's doubles.
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
-- Set when the value is not as this script writes it (the earlier hash, or buckets of another
-- length): u and v are then made so, and an admission sets the whole value, keeping its expiry.
local rewrite = type(v) == 'table'
local WRONGTYPE = 'WRONGTYPE the key does not hold a sliding window counter'
if rewrite then
  -- HLEN fails on a key of any other type. The earlier script kept the warm-up start and the
  -- buckets of about two windows of the most buckets (more only after a change of bucket
  -- length), each a whole number as HINCRBY and %d write it: counts up to MAX_LIMIT, bucket
  -- indexes and the start up to MAX_CLOCK_MS (2^52 ms).
  if redis.call('HLEN', key) > 204 then
    return redis.error_reply(WRONGTYPE)
  end
  local function whole(text, most)
    local x = tonumber(text)
    if x and x >= 0 and x <= most and string.format('%d', x) == text then
      return x
    end
  end
  local h, counts = redis.call('HGETALL', key), {}
  t = j - n
  for f = 1, #h, 2 do
    local c = whole(h[f + 1], h[f] == 's' and 4503599627370496 or 1e9)
    local k = h[f] == 's' or whole(h[f], 4503599627370496)
    if not (c and k) then
      return redis.error_reply(WRONGTYPE)
    end
    if k == true then
      since, o = c, 4
    elseif k <= j + n + 1 then
      counts[k] = c
      t = math.max(t, k)
    end
  end
  u = {o - 2, t * b, since}
  for k = t, j - n, -1 do
    u[o + t - k] = counts[k] or 0
  end
elseif v then
  local kind = string.byte(v)
  if kind == 2 then
    o = 4
  end
  local m = (#v - 7 * o + 13) / 4
  -- At most MAX_BUCKETS + 1 counts: no writer keeps more.
  if (kind ~= 1 and kind ~= 2) or m < 0 or m % 1 ~= 0 or m > 101 then
    return redis.error_reply(WRONGTYPE)
  end
  u = {struct.unpack((o == 3 and '<BI7' or '<BI7I7') .. string.rep('I4', m), v)}
  u[#u] = nil
  -- No start the library sends lies past MAX_CLOCK_MS (2^52 ms), below which every bucket index
  -- and step between them is exact.
  if u[2] > 4503599627370496 then
    return redis.error_reply(WRONGTYPE)
  end
  t, since = floor(u[2] / b), o == 4 and u[3] or nil
  if u[2] % b ~= 0 then
    -- Counted under another bucket length (the rule's window or buckets changed), which the
    -- value does not say: every count is taken as one of the bucket holding the newest start
    -- (docs/redis.md says what a change of settings may then let through).
    local sum = 0
    for i = o, #u do
      sum = sum + u[i]
    end
    u, rewrite = {o - 2, t * b, since}, true
    u[o] = math.min(sum, 1e9)
  end
end
if rewrite then
  v = struct.pack((o == 3 and '<BI7' or '<BI7I7') .. string.rep('I4', #u - o + 1), unpack(u))
end
-- A caller whose clock lies behind the newest bucket (another's is ahead) is decided as at that
-- bucket's start, its times still measured from its own now: the key's time never steps back.
-- From here t <= j.
if t > j then
  j, r = t, 0
end
local weighted, base, ot, hs = j - n, (n + 2) * b + 1, o + t, 7 * o - 13
-- Only buckets lo ..= t hold counts (none when the value is empty).
local lo = t - #u + o
local mode = ARGV[6]
if mode == 'r' then
  local left = cost
  for k = t, math.max(weighted + 1, lo), -1 do
    local taken = math.min(left, u[ot - k])
    u[ot - k], left = u[ot - k] - taken, left - taken
  end
  if left < cost then
    v = struct.pack((o == 3 and '<BI7' or '<BI7I7') .. string.rep('I4', #u - o + 1), unpack(u))
    redis.call('SET', key, v, 'KEEPTTL')
  end
  return {now, cost - left, v or ''}
end

-- The full buckets' sum, the weighted bucket's count (0 when t is older) and the newest counted
-- bucket with permits (the key holds nothing once it has left).
local full, old, newest = 0, 0, weighted
for k = t, math.max(weighted + 1, lo), -1 do
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
local admit
local warm_start = false
if mode then
  cost = math.min(cost, math.max(ARGV[7] - estimate, 0))
  admit = cost > 0
  if not admit then
    return {now, 0, v or ''}
  end
  -- An idle key (no count from the weighted bucket on) is written anew, with the ramp's start.
  if ARGV[8] == '1' and newest == weighted and old == 0 then
    since, warm_start = now, true
  end
else
  admit = estimate + cost <= limit
end
-- When remaining next grows (spec.rs): when the weighted bucket's share drops, or, when it adds
-- nothing, 1 ms after the oldest counted bucket with permits (an admission's included) becomes
-- the weighted one. Times are j * b + offset - now: now may lie before bucket j (see above).
local next_ms = 0
if share > 0 then
  next_ms = j * b + math.min(floor(b * (old - share) / old) + 1, b) - now
else
  local oldest
  for k = math.max(weighted + 1, lo), t do
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
  -- counted behind it) with its expiry; into the newest bucket the count is overwritten in
  -- place, or, when buckets before j - n are to go (or the key is the earlier hash), the value
  -- is set keeping its expiry.
  local reset, count = (j + n + 1) * b - now, cost
  if j == t then
    count = cost + (u[o] or 0)
  end
  if j > t or not v or warm_start then
    local value
    if since then
      value = struct.pack('<BI7I7I4', 2, j * b, since, count)
    else
      value = struct.pack('<BI7I4', 1, j * b, count)
    end
    local keep = math.min(t - lo + 1, n + 1 - (j - t))
    -- (A ramp started into bucket t = j keeps nothing behind it: the key held nothing.)
    if v and keep > 0 and j > t then
      value = value .. string.rep('\0\0\0\0', j - t - 1) .. string.sub(v, hs + 1, hs + 4 * keep)
    end
    redis.call('SET', key, value, 'PX', string.format('%d', reset + slack))
  else
    local packed, ends = struct.pack('<I4', count), hs + 4 * (n + 1)
    if rewrite or #v > ends then
      v = string.sub(v .. string.rep('\0', hs + 4 - #v), 1, hs) .. packed .. string.sub(v, hs + 5, ends)
      redis.call('SET', key, v, 'KEEPTTL')
    else
      redis.call('SETRANGE', key, hs, packed)
    end
  end
  if mode then
    return {now, cost, redis.call('GET', key)}
  end
  local remaining = limit - estimate - cost
  local reply = (remaining * base + reset) * base + next_ms
  if reset < base and reply < 9007199254740992 then
    return reply
  end
  return {remaining, reset, next_ms}
end

-- Denied: the first instant the estimate leaves room for cost. In bucket k the full buckets
-- sum to `full` (bucket k joins it empty) and the weighted one, count `old`, adds
-- floor(old * (b - r) / b), which is <= left iff r > b * (old - left - 1) / old.
-- While the full buckets alone leave no room, nothing changes until the oldest bucket with
-- permits (lo) becomes the weighted one: the search skips to it.
local room, retry = limit - cost, 0
local k, last = j, j + n + 1
while k <= last do
  local w = k - n
  if k > j then
    full = full - ((w <= t and u[ot - w]) or 0)
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
  elseif k == j then
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
