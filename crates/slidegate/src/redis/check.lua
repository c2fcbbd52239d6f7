-- slidegate: every algorithm, one atomic decision over one or several keys (all or nothing).
-- (One key without warm-up goes through a leaner script: sliding_log.lua, sliding_window.lua or
-- one_key.lua, each writing values the other reads alike.) Semantics: src/spec.rs, which this
-- implements independently.
--
-- KEYS[i]     check i's state: a sorted set (sliding log); a string of counts by bucket
--             (sliding window: see sliding_window.lua); or a hash: i/n = window index and count
--             (fixed window), t = theoretical arrival time in µs (GCRA), s = warm-up start (ms).
--             The sliding window keeps its warm-up start in its string, the sliding log in a
--             member '0:<ms>' scored -inf, ahead of every entry. A sliding log whose limit is
--             at most 256 holds one member per permit (sliding_log.lua's), a larger one counted
--             entries (counted_log.lua's), and so does a key that holds them when its limit is
--             lowered; a per-permit key is rewritten as counted entries when one is added to it.
-- ARGV[1]     id: unique per call across all clients (the client's random id + a counter)
-- ARGV[2]     now in ms, or "" for Redis' own TIME (see sliding_log.lua)
-- ARGV[3]     "1" to decide and record, "0" to look only (inspect: cost 0, nothing written)
-- ARGV[3+7(i-1)+1..7]  check i: algorithm (l = sliding log, w = sliding window, f = fixed
--             window, g = GCRA), limit, window ms, cost, buckets (w) or burst (g) or 0,
--             warm-up period ms (0 = none), cold share in thousandths. Validated by the caller:
--             1 <= cost <= what an idle key admits, keys distinct, products below 2^53, at most
--             MAX_CHECKS (16) checks. A per-permit log writes cost <= limit <= 256 members, a
--             counted one one member; with at most 256 expired members removed besides (and a
--             rewrite bounded by the key's entries, once), the work is bounded.
-- Returns     {admitted 0|1, then per key: fits 0|1, remaining, reset_after_ms,
--             retry_after_ms or -1, effective limit, next_permit_after_ms}. When a key does not
--             fit, nothing is written anywhere and a key that fit reports its uncharged remaining
--             (and when that next grows, as the key stands).
-- Cluster     every key of one call must hash to one slot (the caller checks).
--
-- Numbers are Lua doubles: every value here stays below 2^53, where they are exact integers,
-- and numbers are formatted with %d before they are stored. The code is one flat loop per
-- phase, not a function per algorithm: Redis runs the whole chunk on every call, and defining
-- closures each time cost more than the decision itself (measured: bench/results/2026-12-01.md).
local id, now_s, record = ARGV[1], ARGV[2], ARGV[3] == '1'
-- Expiry runs on Redis' clock; a caller's clock gets a minute of slack (see sliding_log.lua).
local ttl_slack = 60000
if now_s == '' then
  ttl_slack = 0
  local t = redis.call('TIME')
  now_s = t[1] .. string.sub('00000' .. t[2], -6, -4)
end
local now = tonumber(now_s)
local floor, ceil, max, min, fmt = math.floor, math.ceil, math.max, math.min, string.format
local WRONGTYPE = 'WRONGTYPE the key does not hold a sliding window counter'
-- A counted entry: 'c<time ms>:<n><seq>:<weight>:<cum>:<id or tail>' (see counted_log.lua).
local ENTRY = '^c(%d+):%a(%d+):(%d+):(%d+):'

-- The effective limit: a warm-up ramps from cold/1000 of the limit to all of it over `period`
-- ms from `since`, the first admission after the key was idle. A key with no recorded start
-- that is not idle (warm-up added to a busy key) counts as warm.
local function effective(c, since)
  if c.period == 0 then
    return c.limit
  end
  if c.idle then
    since = now
  elseif not since then
    since = now - c.period
  end
  local e = min(max(now - since, 0), c.period)
  local f = c.cold + floor((1000 - c.cold) * e / c.period)
  return max(1, floor(c.limit * f / 1000))
end

-- Phase 1: evaluate every check, writing nothing. Each sets fits, remaining and limit_out, and
-- reset (admitted) or retry (denied), and keeps what phase 2 needs.
local checks, admitted, logs = {}, 1, 0
for i = 1, #KEYS do
  local a = 3 + 7 * (i - 1)
  local c = {
    key = KEYS[i], alg = ARGV[a + 1], limit = tonumber(ARGV[a + 2]), window = tonumber(ARGV[a + 3]),
    cost = tonumber(ARGV[a + 4]), param = tonumber(ARGV[a + 5]), period = tonumber(ARGV[a + 6]),
    cold = tonumber(ARGV[a + 7]), retry = -1,
  }
  local key, alg = c.key, c.alg
  if alg == 'l' then
    -- Sliding log.
    local marker, since = 0, nil
    if c.period > 0 then
      local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      if first[2] == '-inf' then
        marker, since = 1, tonumber(string.sub(first[1], 3))
      end
    end
    c.edge = now - c.window
    local n = redis.call('ZCARD', key) - marker
    local newest = n > 0 and redis.call('ZRANGE', key, '-1', '-1')[1]
    c.n, c.counted = n, newest and string.find(newest, ENTRY) ~= nil
    c.write_counted = c.counted or c.limit > 256
    logs = logs + 1
    if c.counted then
      -- Counted entries: live permits from the newest and the oldest live entry's sums. Seq s
      -- sits at rank c.base + s - oseq (a warm-up marker left by a rule that lost its warm-up
      -- sits before the oldest entry and goes with the expired).
      local nt, nseq, _, ncum = string.match(newest, ENTRY)
      nt, ncum, nseq = tonumber(nt), tonumber(ncum), tonumber(nseq)
      c.nt, c.ncum, c.nseq, c.base = nt, ncum, nseq, marker
      local ot, oseq, ow, ocum = string.match(redis.call('ZRANGE', key, marker, marker)[1], ENTRY)
      if not ot then
        c.base, c.stray = marker + 1, 1
        ot, oseq, ow, ocum = string.match(redis.call('ZRANGE', key, '(-inf', '+inf', 'BYSCORE', 'LIMIT', 0, 1)[1], ENTRY)
      end
      oseq = tonumber(oseq)
      local lt, lw, lcum, lseq = tonumber(ot), tonumber(ow), tonumber(ocum), oseq
      local live = 0
      if nt <= c.edge then
        lseq = nseq + 1
      else
        if lt <= c.edge then
          lt, lseq, lw, lcum = string.match(redis.call('ZRANGE', key, '(' .. fmt('%d', c.edge), '+inf', 'BYSCORE', 'LIMIT', 0, 1)[1], ENTRY)
          lt, lw, lcum, lseq = tonumber(lt), tonumber(lw), tonumber(lcum), tonumber(lseq)
        end
        live = ncum - lcum + lw
        c.oldest = lt
      end
      c.idle, c.live, c.marker, c.expired = live == 0, live, marker, lseq - oseq + (c.stray or 0)
      local limit = effective(c, since)
      c.limit_out = limit
      if live + c.cost <= limit then
        c.fits, c.remaining, c.reset = 1, limit - live - c.cost, c.window
      else
        -- The oldest entries up to seq hi hold the permits that must leave (counted_log.lua).
        local need, base = live + c.cost - limit, lcum - lw
        local lo, hi, bt = lseq, lseq, lt
        if lw < need then
          hi, bt = nseq, nt
          while hi - lo > 1 do
            local mid = floor((lo + hi) / 2)
            local r = fmt('%d', c.base + mid - oseq)
            local mt, _, _, mcum = string.match(redis.call('ZRANGE', key, r, r)[1], ENTRY)
            if tonumber(mcum) - base >= need then
              hi, bt = mid, tonumber(mt)
            else
              lo = mid
            end
          end
        end
        c.fits, c.remaining, c.retry = 0, max(limit - live, 0), bt + c.window - now
      end
    else
      local live = 0
      if n > 0 then
        live = redis.call('ZCOUNT', key, '(' .. fmt('%d', c.edge), '+inf')
      end
      c.idle, c.live, c.marker, c.expired = live == 0, live, marker, n - live
      local limit = effective(c, since)
      c.limit_out = limit
      -- The oldest live entry: when remaining next grows.
      local first = marker + n - live
      if live + c.cost <= limit then
        c.fits, c.remaining, c.reset = 1, limit - live - c.cost, c.window
      else
        -- The k-th oldest live entry must leave; the marker and expired entries come first.
        local at = first + (live + c.cost - limit) - 1
        local blocking = tonumber(redis.call('ZRANGE', key, at, at, 'WITHSCORES')[2])
        c.fits, c.remaining, c.retry = 0, max(limit - live, 0), blocking + c.window - now
        if at == first then
          c.oldest = blocking
        end
      end
      if live > 0 and not c.oldest then
        c.oldest = tonumber(redis.call('ZRANGE', key, first, first, 'WITHSCORES')[2])
      end
    end
  elseif alg == 'w' then
    -- Sliding window counter.
    local n = c.param
    local b = c.window / n
    local j, r = floor(now / b), now % b
    -- The value as sliding_window.lua lays it out and reads it (t the newest bucket), or the
    -- earlier hash (HLEN fails on a key of any other type), read into counts by bucket; a value
    -- sliding_window.lua refuses is refused here too.
    local counts, since, t, v = {}, nil, nil, redis.pcall('GET', key)
    if type(v) == 'table' then
      if redis.call('HLEN', key) > 204 then
        return redis.error_reply(WRONGTYPE)
      end
      local function whole(text, most)
        local x = tonumber(text)
        if x and x >= 0 and x <= most and fmt('%d', x) == text then
          return x
        end
      end
      local h = redis.call('HGETALL', key)
      for f = 1, #h, 2 do
        local count = whole(h[f + 1], h[f] == 's' and 4503599627370496 or 1e9)
        local k = h[f] == 's' or whole(h[f], 4503599627370496)
        if not (count and k) then
          return redis.error_reply(WRONGTYPE)
        end
        if k == true then
          since = count
        elseif k <= j + n + 1 then
          counts[k], t = count, max(t or k, k)
        end
      end
    elseif v then
      local kind, o = string.byte(v), 3
      if kind == 2 then
        o = 4
      end
      local m = (#v - 7 * o + 13) / 4
      -- At most MAX_BUCKETS + 1 counts: no writer keeps more.
      if (kind ~= 1 and kind ~= 2) or m < 0 or m % 1 ~= 0 or m > 101 then
        return redis.error_reply(WRONGTYPE)
      end
      local u = {struct.unpack((o == 3 and '<BI7' or '<BI7I7') .. string.rep('I4', m), v)}
      if u[2] > 4503599627370496 then
        -- Past MAX_CLOCK_MS (2^52 ms): no start the library sends.
        return redis.error_reply(WRONGTYPE)
      end
      t = floor(u[2] / b)
      if o == 4 then
        since = u[3]
      end
      if u[2] % b ~= 0 then
        -- A start of another bucket length: every count is the bucket's holding it, as
        -- sliding_window.lua reads it.
        local sum = 0
        for i = o, #u - 1 do
          sum = sum + u[i]
        end
        counts[t] = min(sum, 1e9)
      else
        for i = o, #u - 1 do
          if u[i] > 0 then
            counts[t + o - i] = u[i]
          end
        end
      end
    end
    if t and t > j then
      j, r = t, 0
    end
    c.t = t
    local full, newest = 0, nil
    for k, count in pairs(counts) do
      if k > j - n and k <= j then
        full = full + count
      end
      if k >= j - n and count > 0 and (not newest or k > newest) then
        newest = k
      end
    end
    c.n, c.b, c.j, c.r, c.counts, c.newest, c.idle, c.since = n, b, j, r, counts, newest, newest == nil, since
    local limit = effective(c, since)
    c.limit_out = limit
    -- The oldest bucket, partly out of the window, counts for its share still inside.
    local estimate = full + floor((counts[j - n] or 0) * (b - r) / b)
    if estimate + c.cost <= limit then
      c.fits, c.remaining, c.reset = 1, limit - estimate - c.cost, (j + n + 1) * b - now
    else
      c.fits, c.remaining = 0, max(limit - estimate, 0)
      -- The first instant the estimate is <= room. In bucket k the full buckets sum to `full`
      -- (bucket k joins it empty: none lies ahead of j) and the weighted one, count `old`, adds
      -- floor(old * (b - r) / b), which is <= left iff r > b * (old - left - 1) / old.
      local room = limit - c.cost
      for k = j, j + n + 1 do
        if k > j then
          full = full - (counts[k - n] or 0)
        end
        local old, left = counts[k - n] or 0, room - full
        if left >= 0 then
          local r0 = 0
          if k == j then
            r0 = r
          end
          if old > left then
            r0 = max(r0, floor(b * (old - left - 1) / old) + 1)
          end
          if r0 < b then
            c.retry = k * b + r0 - now
            break
          end
        end
      end
    end
  elseif alg == 'f' then
    -- Fixed window.
    local w = c.window
    local j = floor(now / w)
    local h = redis.call('HMGET', key, 'i', 'n', 's')
    local index, count = tonumber(h[1]), 0
    if index == j then
      count = tonumber(h[2])
    end
    c.j, c.count, c.idle = j, count, index == nil or index + 1 < j
    local limit = effective(c, tonumber(h[3]))
    c.limit_out = limit
    local reset = (j + 1) * w - now
    if count + c.cost <= limit then
      c.fits, c.remaining, c.reset = 1, limit - count - c.cost, reset
    else
      c.fits, c.remaining, c.retry = 0, max(limit - count, 0), reset
    end
  else
    -- GCRA.
    local h = redis.call('HMGET', key, 't', 's')
    local tat, now_us = tonumber(h[1]) or 0, now * 1000
    local tau = c.param * floor(c.window * 1000 / c.limit)
    c.idle = tat <= now_us
    local limit = effective(c, tonumber(h[2]))
    -- While warming up, each permit costs window / effective limit.
    local te = floor(c.window * 1000 / limit)
    local base = max(tat, now_us)
    c.base, c.new, c.now_us, c.te, c.limit_out = base, base + c.cost * te, now_us, te, floor(tau / te)
    if c.new - now_us <= tau then
      c.fits, c.remaining, c.reset = 1, floor((now_us + tau - c.new) / te), ceil((c.new - now_us) / 1000)
    else
      c.fits, c.remaining = 0, floor(max(now_us + tau - base, 0) / te)
      c.retry = ceil((c.new - tau - now_us) / 1000)
    end
  end
  if c.fits == 0 then
    admitted = 0
  end
  checks[i] = c
end
if not record then
  admitted = 0
end

-- Phase 2: record every check, or report each one's state without writing.
local out = {admitted}
for i, c in ipairs(checks) do
  local key, alg = c.key, c.alg
  local warm_start = c.period > 0 and c.idle
  if admitted == 1 then
    if alg == 'l' then
      -- Expired entries follow the marker. At most 256 / (sliding logs in this call) go per key
      -- (and the cost, at least, on a per-permit key), so the call's work stays bounded, and at
      -- least as many as are added, so a set never holds more entries than its limit (see
      -- sliding_log.lua). A per-permit key taking a counted entry is rewritten whole instead.
      local at, cum, seq = now, c.cost, 1
      if c.write_counted and not c.counted and c.n > 0 then
        local members = redis.call('ZRANGE', key, '(' .. fmt('%d', c.edge), '+inf', 'BYSCORE')
        redis.call('ZREMRANGEBYSCORE', key, '(-inf', '+inf')
        local args, j = {}, 1
        cum, seq = 0, 0
        while j <= #members do
          local t = string.match(members[j], '^%d+')
          local k = j
          while k < #members and string.match(members[k + 1], '^%d+') == t do
            k = k + 1
          end
          cum, seq, at = cum + k - j + 1, seq + 1, max(now, tonumber(t))
          args[#args + 1] = t
          local seq_s = fmt('%d', seq)
          args[#args + 1] = fmt('c%s:%s%s:%d:%d:%s', t, string.char(96 + #seq_s), seq_s, k - j + 1, cum, id)
          -- unpack takes at most a few thousand values at once.
          if #args == 2000 or k == #members then
            redis.call('ZADD', key, unpack(args))
            args = {}
          end
          j = k + 1
        end
        cum, seq = cum + c.cost, seq + 1
      else
        local drop = min(c.expired, max(1, floor(256 / logs)))
        if not c.counted then
          drop = min(c.expired, c.cost + floor(256 / logs))
        end
        if drop > 0 then
          redis.call('ZREMRANGEBYRANK', key, c.marker, c.marker + drop - 1)
        end
        if c.counted then
          at, cum, seq = max(now, c.nt), c.ncum + c.cost, c.nseq + 1
        end
      end
      if warm_start then
        if c.marker == 1 then
          redis.call('ZREMRANGEBYSCORE', key, '-inf', '-inf')
        end
        redis.call('ZADD', key, '-inf', '0:' .. now_s)
      end
      if c.write_counted then
        local at_s, seq_s = fmt('%d', at), fmt('%d', seq)
        redis.call('ZADD', key, at_s, fmt('c%s:%s%s:%d:%d:%s', at_s, string.char(96 + #seq_s), seq_s, c.cost, cum, id))
      elseif c.cost == 1 then
        redis.call('ZADD', key, now_s, now_s .. ':' .. id)
      else
        local member, args = now_s .. ':' .. id, {}
        for j = 1, c.cost do
          args[2 * j - 1] = now_s
          args[2 * j] = member .. ':' .. j
        end
        redis.call('ZADD', key, unpack(args))
      end
      redis.call('PEXPIRE', key, fmt('%d', c.window + ttl_slack + at - now))
    elseif alg == 'w' then
      -- The whole value, newest bucket first, down to the oldest counted one with permits.
      local j, counts = c.j, c.counts
      counts[j] = (counts[j] or 0) + c.cost
      local top, low, out = j, j, {}
      for k in pairs(counts) do
        if k >= j - c.n then
          top, low = max(top, k), min(low, k)
        end
      end
      for k = top, low, -1 do
        out[top - k + 1] = counts[k] or 0
      end
      local last = top - low + 1
      local value, since = nil, c.since
      if warm_start then
        since = now
      end
      if since then
        value = struct.pack('<BI7I7' .. string.rep('I4', last), 2, top * c.b, since, unpack(out, 1, last))
      else
        value = struct.pack('<BI7' .. string.rep('I4', last), 1, top * c.b, unpack(out, 1, last))
      end
      -- Only a new newest bucket moves the expiry (see sliding_window.lua).
      if not c.t or j > c.t then
        redis.call('SET', key, value, 'PX', fmt('%d', (j + c.n + 1) * c.b - now + ttl_slack))
      else
        redis.call('SET', key, value, 'KEEPTTL')
      end
    elseif alg == 'f' then
      -- Under warm-up the previous window tells whether the key was idle: keep it a window longer.
      local ends = c.j + 1
      if c.period > 0 then
        ends = ends + 1
      end
      if warm_start then
        redis.call('HSET', key, 'i', fmt('%d', c.j), 'n', fmt('%d', c.count + c.cost), 's', now_s)
      else
        redis.call('HSET', key, 'i', fmt('%d', c.j), 'n', fmt('%d', c.count + c.cost))
      end
      redis.call('PEXPIRE', key, fmt('%d', ends * c.window - now + ttl_slack))
    else
      if warm_start then
        redis.call('HSET', key, 't', fmt('%d', c.new), 's', now_s)
      else
        redis.call('HSET', key, 't', fmt('%d', c.new))
      end
      redis.call('PEXPIRE', key, fmt('%d', ceil((c.new - c.now_us) / 1000) + ttl_slack))
    end
  else
    -- Until the key holds nothing, as it stands (no write).
    if alg == 'l' then
      c.reset = 0
      if c.live > 0 then
        c.reset = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) + c.window - now
      end
    elseif alg == 'w' then
      c.reset = 0
      if c.newest then
        c.reset = (c.newest + c.n + 1) * c.b - now
      end
    elseif alg == 'f' then
      c.reset = 0
      if c.count > 0 then
        c.reset = (c.j + 1) * c.window - now
      end
    else
      c.reset = ceil((c.base - c.now_us) / 1000)
    end
    if c.fits == 1 then
      c.remaining = c.remaining + c.cost
    end
  end
  -- When remaining next grows (spec.rs): the key as it now stands, an admission counted.
  local next_ms = c.reset
  if alg == 'l' then
    next_ms = 0
    if admitted == 1 then
      next_ms = min(c.oldest or now, now) + c.window - now
    elseif c.oldest then
      next_ms = c.oldest + c.window - now
    end
  elseif alg == 'w' then
    -- While the weighted bucket adds a share, when that share drops; otherwise 1 ms after the
    -- oldest bucket with permits becomes the weighted one.
    local n, b, j, r = c.n, c.b, c.j, c.r
    local old = c.counts[j - n] or 0
    local share = floor(old * (b - r) / b)
    if share > 0 then
      next_ms = j * b + min(floor(b * (old - share) / old) + 1, b) - now
    else
      local oldest
      if admitted == 1 then
        oldest = j
      end
      for k, count in pairs(c.counts) do
        if k > j - n and k <= j and count > 0 and (not oldest or k < oldest) then
          oldest = k
        end
      end
      next_ms = 0
      if oldest then
        next_ms = (oldest + n) * b + 1 - now
      end
    end
  elseif alg == 'g' then
    -- One more permit is free once the bucket has drained to limit - remaining - 1 of them.
    next_ms = 0
    if c.remaining < c.limit_out then
      next_ms = max(c.reset - floor((c.limit_out - c.remaining - 1) * c.te / 1000), 0)
    end
  end
  local o = 6 * (i - 1) + 1
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] =
    c.fits, c.remaining, c.reset, c.retry, c.limit_out, next_ms
end
return out
