-- slidegate: a charge or a refund (src/spec.rs, "Charges and refunds") of a sliding log, one
-- key, one atomic step, in either of its two forms: one member per permit (sliding_log.lua's)
-- or counted entries (counted_log.lua's, whose header gives their format). Only the state
-- changes here; the caller computes the key's standing from the few admissions this returns
-- (spec::LogSummary), by the specification's own code. Runs with warm_up.lua prepended.
--
-- KEYS[1]  the key's sorted set
-- ARGV[1]  id: unique per call across all clients (the client's random id + a counter)
-- ARGV[2]  window in ms, ARGV[3] limit, ARGV[4] cost (1 <= cost; the caller bounds it)
-- ARGV[5]  'c' (charge) or 'r' (refund)
-- ARGV[6]  the most the key may hold (MAX_CHARGE_FACTOR times the limit)
-- ARGV[7]  now in ms; absent or "" for Redis' own TIME (see sliding_log.lua); "-<ms>" for that
--          long before Redis' TIME (a write-back of an admission made while Redis was away:
--          placed at its own time, and the key's TTL still runs out when its newest entry leaves)
-- ARGV[8..9]  a warm-up: its period in ms (0 or absent: none) and its cold share in
--          thousandths. Its start is check.lua's member '0:<ms>' scored -inf, taken out here
--          first and put back last (while the key exists: it keeps its expiry); a charge into
--          an idle key starts the ramp now.
-- Returns  {now ms, permits in the window after, the oldest and the newest of their times, the
--          time of the permit at index count - limit from the oldest when count > limit (else
--          0; limit the effective one), permits recorded or given back, the warm-up's start
--          (0: none)}
-- A charge that finds per-permit members under a limit above 256, or would leave them over the
-- limit, first rewrites them as counted entries, one of weight 1 per member, in the same call:
-- sliding_log.lua relies on a per-permit key holding no more than its limit (its denial of one
-- permit then waits for the oldest entry); counted_log.lua decides a key over its limit as any
-- other.
-- Cluster  touches KEYS[1] only.
--
-- Bounded work: a per-permit key holds at most its limit (<= 256) live members and a call
-- writes, or rewrites, at most that many; a counted charge writes one entry and drops at most
-- 256 expired ones; a counted refund removes a suffix of entries by rank and rewrites at most
-- one; finding an entry by its permits is a binary search by rank (about 17 reads at
-- MAX_LOG_LIMIT entries).
local key = KEYS[1]
local now_s = ARGV[7]
local ago = 0
if now_s and string.sub(now_s, 1, 1) == '-' then
  ago = tonumber(string.sub(now_s, 2))
end
local server_time = not now_s or now_s == '' or ago > 0
local now
if server_time then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000) - ago
else
  now = tonumber(now_s)
end
local window, limit, cost, full = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local charge = ARGV[5] == 'c'
local edge = now - window
local fmt, match = string.format, string.match
local period, cold = tonumber(ARGV[8] or '0'), tonumber(ARGV[9] or '0')
local since
if period > 0 then
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] == '-inf' then
    since = tonumber(string.sub(first[1], 3))
    redis.call('ZREM', key, first[1])
  end
end
-- The effective limit the key's standing is measured by once it holds `count` permits (a
-- charge into an idle key, `live` == 0, starts the ramp now).
local function effective(live, permits, count)
  if period > 0 and charge and live == 0 and permits > 0 then
    since = now
  end
  return warm_limit(limit, period, cold, since, count == 0, now)
end

-- The answer, the ramp's start put back first (ranks are read before: it sits at rank 0).
local function answer(count, oldest, newest, blocking, permits)
  if since and count > 0 then
    redis.call('ZADD', key, '-inf', fmt('0:%d', since))
  end
  return {now, count, oldest, newest, blocking, permits, since or 0}
end
local ENTRY = '^c(%d+):(%a)(%d+):(%d+):(%d+):'

local function at_rank(r)
  local s = fmt('%d', r)
  return redis.call('ZRANGE', key, s, s)[1]
end

local newest = redis.call('ZRANGE', key, '-1', '-1')[1]
local counted
if newest then
  counted = match(newest, '^c') ~= nil
else
  counted = limit > 256 or (charge and math.min(cost, full) > limit)
end

local count, permits, live
if not counted then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', edge))
  count = redis.call('ZCARD', key)
  live = count
  if not charge then
    permits = math.min(cost, count)
    if permits > 0 then
      redis.call('ZREMRANGEBYRANK', key, fmt('%d', -permits), '-1')
    end
    count = count - permits
  else
    permits = math.max(math.min(cost, full - count), 0)
    local args = {}
    if limit > 256 or count + permits > limit then
      -- Rewritten as counted entries; the charge is then recorded as for any counted key.
      for i, m in ipairs(redis.call('ZRANGE', key, '0', '-1')) do
        local t, seq = match(m, '^%d+'), fmt('%d', i)
        args[2 * i - 1] = t
        args[2 * i] = fmt('c%s:%s%s:1:%d:%s', t, string.char(96 + #seq), seq, i, ARGV[1])
      end
      counted, newest = true, args[#args]
      redis.call('ZREMRANGEBYRANK', key, '0', '-1')
    elseif permits > 0 then
      local stamp = fmt('%d', now)
      for i = 1, permits do
        args[2 * i - 1] = stamp
        args[2 * i] = fmt('%s:%s:%d', stamp, ARGV[1], i)
      end
      count = count + permits
    end
    if #args > 0 then
      redis.call('ZADD', key, unpack(args))
      -- Every member written is in the window from now on: it leaves within a window. Written
      -- `ago`, it leaves sooner, and must not cut short a newer member's time.
      if server_time and ago == 0 then
        redis.call('PEXPIRE', key, ARGV[2])
      elseif server_time then
        local left = math.max(window - ago, 1)
        if redis.call('PTTL', key) < left then
          redis.call('PEXPIRE', key, fmt('%d', left))
        end
      else
        redis.call('PEXPIRE', key, fmt('%d', window + 60000))
      end
    end
  end
end
if not counted then
  local most = effective(live, permits, count)
  if count == 0 then
    return answer(0, 0, 0, 0, permits)
  end
  local time = function(r) return tonumber(match(at_rank(r), '^%d+')) end
  local blocking = 0
  if count > most then
    blocking = time(count - most)
  end
  return answer(count, time(0), time(count - 1), blocking, permits)
end

-- Counted entries: ranks r0 .. n - 1 are live (the expired ones, and a warm-up marker scored
-- -inf, come first); `base` is the permits admitted before the oldest live one.
local n = redis.call('ZCARD', key)
local r0 = redis.call('ZCOUNT', key, '-inf', fmt('%d', edge))
local count, lt, nt, ncum, nseq, base = 0, nil, nil, 0, 0, 0
if newest then
  local t, _, s, _, c = match(newest, ENTRY)
  nt, nseq, ncum, base = t + 0, s + 0, c + 0, c + 0
end
if r0 < n then
  local t, _, _, w, c = match(at_rank(r0), ENTRY)
  lt, base = t + 0, c - w
  count = ncum - base
end
live = count
-- The first live entry whose cumulative count, less base, reaches `need`: its rank and fields.
local function find(need)
  local lo, hi = r0 - 1, n - 1
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    local _, _, _, _, c = match(at_rank(mid), ENTRY)
    if c - base >= need then
      hi = mid
    else
      lo = mid
    end
  end
  return hi, match(at_rank(hi), ENTRY)
end

local permits
if charge then
  permits = math.max(math.min(cost, full - count), 0)
  if permits > 0 then
    local drop = math.min(r0, 256)
    if drop > 0 then
      redis.call('ZREMRANGEBYRANK', key, '0', fmt('%d', drop - 1))
      r0, n = r0 - drop, n - drop
    end
    -- Never stamped before the newest entry (see counted_log.lua): cum and seq grow with rank.
    local at = math.max(now, nt or now)
    local seq = fmt('%d', nseq + 1)
    ncum = ncum + permits
    local member = fmt('c%d:%s%s:%d:%d:%s', at, string.char(96 + #seq), seq, permits, ncum, ARGV[1])
    redis.call('ZADD', key, fmt('%d', at), member)
    if server_time then
      redis.call('PEXPIREAT', key, fmt('%d', at + window))
    else
      redis.call('PEXPIRE', key, fmt('%d', window + at - now + 60000))
    end
    if count == 0 then
      lt = at
    end
    nt, n, count = at, n + 1, count + permits
  end
else
  permits = math.min(cost, count)
  if permits > 0 then
    local target = ncum - permits
    local p, t, letter, s, w, c = find(target - base + 1)
    -- Removing from rank 0 removes the key with its expiry: the entry that stays then takes it back.
    local ttl = p == 0 and redis.call('PTTL', key)
    redis.call('ZREMRANGEBYRANK', key, fmt('%d', p), '-1')
    local start = c - w
    if start < target then
      -- The entry straddles what stays: it keeps its time and place with fewer permits.
      redis.call('ZADD', key, t, fmt('c%s:%s%s:%d:%d:%s', t, letter, s, target - start, target, ARGV[1]))
      if ttl and ttl > 0 then
        redis.call('PEXPIRE', key, ttl)
      end
      n = p + 1
    elseif p > 0 then
      -- The newest entry left is one an admission wrote before; a tail of counted_log.lua's
      -- (e.d.live, with its dots) would now claim an expiry set by an entry since removed: it
      -- gets an id instead, as every other entry has.
      n = p
      local m = at_rank(n - 1)
      local mt, head = match(m, '^c(%d+):(%a%d+:%d+:%d+:)[%x]+%.')
      if mt then
        -- Added before the old one goes, so the key is never empty (which would drop its expiry).
        redis.call('ZADD', key, mt, 'c' .. mt .. ':' .. head .. ARGV[1])
        redis.call('ZREM', key, m)
      end
    else
      n = 0
    end
    count, ncum = count - permits, target
    if count > 0 then
      nt = match(at_rank(n - 1), ENTRY) + 0
    end
  end
end
local most = effective(live, permits, count)
if count == 0 then
  return answer(0, 0, 0, 0, permits)
end
local blocking = 0
if count > most then
  local _, t = find(count - most + 1)
  blocking = t + 0
end
return answer(count, lt, nt, blocking, permits)
