-- slidegate: sliding window log of counted entries, one key, one atomic decision: the log of a
-- quota whose limit is above 256 (sliding_log.lua keeps one member per permit for the others).
--
-- KEYS[1]  the key's sorted set: score = admission time (ms); member =
--          'c<time ms>:<n><seq>:<weight>:<cum>:<tail>', one per admission: seq = its place
--          (consecutive, so it makes the member unique), after a letter n (a = 1, b = 2, ...)
--          giving its digits, so that members of one millisecond sort by seq; weight = its
--          permits; cum = the key's permits admitted up to and including it. The leading 'c' is
--          where sliding_log.lua, reading a time from the first digits, finds none, and so tells
--          a counted key at no cost. The tail is what the next call needs, '<e>.<d>.<live>'
--          (hexadecimal): the key expires e ms after this entry's time (0: unknown); the oldest
--          live entry, first in the set (no expired one left before it), is d ms older than
--          this one; `live` permits were in the window with this one's. Or an id (check.lua's
--          entries, converted ones, and this script's when expired entries are left).
-- ARGV[1]  id: unique per call across all clients (the client's random id + a counter): the
--          tail of an entry that can have none
-- ARGV[2]  window in ms
-- ARGV[3]  limit, ARGV[4] cost (1 <= cost <= limit <= MAX_LOG_LIMIT, checked by the caller)
-- ARGV[5]  now in ms; absent or "" for Redis' own TIME (see sliding_log.lua)
-- Returns  what sliding_log.lua returns, in the same encodings (wire.rs reads both alike).
-- Cluster  touches KEYS[1] only.
--
-- Why counted entries: a call of cost c on a per-permit log writes c members, so a token limit
-- (tens of thousands per call) would do work, and hold Redis' one thread, in proportion to its
-- permits. Here an admission writes one member whatever its cost, and a decision reads the
-- newest and the oldest live entry: live permits = cum(newest) - cum(oldest live) + weight(oldest
-- live), or, when the newest's tail says its oldest live entry is still live, its `live` (the
-- oldest is then read by a denial only). Every call's work is a fixed number of O(log n)
-- calls, plus, for a denial of cost > 1, a binary search by rank for the entry whose leaving
-- makes room (at most ~17 reads at MAX_LOG_LIMIT entries), plus, once per key, the conversion
-- of per-permit members.
-- cum and seq only grow along the ranks because an entry is never stamped before the newest
-- one: with the caller's clock (ARGV[5]) a time behind it is clamped to it, which only delays
-- when the entry leaves (never admits more). Expired entries are a prefix of the set; an
-- admission drops at most 256 of them by rank, at least one when any, while adding one, so a
-- set never holds more than `limit` entries (every live entry holds a permit or more).
-- A key holding per-permit members (written by sliding_log.lua while the quota's limit was 256
-- or less, or by an earlier release) is rewritten first, one counted entry per distinct time;
-- sliding_log.lua, in turn, hands a counted key back here (it replies 'COUNTED').
-- The tail spares an admission two of its five calls (each costs thousands of instructions):
-- reading the oldest entry and setting the expiry. It stays true while its entry is the newest,
-- since entries are added only after the newest (and then carry their own) and removed only
-- as expired prefixes or with the key: the oldest live entry it names stays first until it
-- expires, which its time (this entry's less d) tells. The expiry it names is the key's because
-- every writer sets one and adds an entry, and only this script writes a tail with e > 0.
local key = KEYS[1]
local now_s = ARGV[5]
local server_time = not now_s or now_s == ''
if server_time then
  -- Seconds and the microseconds' first three of six digits: now in ms, as the string an
  -- admission writes, with no arithmetic to format back.
  local t = redis.call('TIME')
  now_s = t[1] .. string.sub('00000' .. t[2], -6, -4)
end
-- `s + 0` parses once where tonumber(s) parses twice (lua_isnumber, then lua_tonumber).
local now, window, limit, cost = now_s + 0, ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0
local edge = now - window
local fmt, match, ENTRY = string.format, string.match, '^c(%d+):%a(%d+):(%d+):(%d+):'

local newest = redis.call('ZRANGE', key, '-1', '-1')[1]
local nt_s, nseq, ncum, ne, nd, nl
if newest then
  nt_s, nseq, ncum, ne, nd, nl = match(newest, '^c(%d+):%a(%d+):%d+:(%d+):(%x+)%.(%x+)%.(%x+)$')
  if not nt_s then
    nt_s, nseq, ncum = match(newest, '^c(%d+):%a(%d+):%d+:(%d+):')
  end
  if not nt_s then
    -- Per-permit members, live ones grouped by time (a warm-up marker '0:<ms>', scored -inf,
    -- goes with the expired; this script serves quotas without warm-up).
    local members = redis.call('ZRANGE', key, fmt('(%d', edge), '+inf', 'BYSCORE')
    redis.call('DEL', key)
    local args, cum, seq, i = {}, 0, 0, 1
    while i <= #members do
      local at = match(members[i], '^%d+')
      local j = i
      while j < #members and match(members[j + 1], '^%d+') == at do
        j = j + 1
      end
      cum, seq = cum + j - i + 1, seq + 1
      args[#args + 1] = at
      local seq_s = fmt('%d', seq)
      args[#args + 1] = fmt('c%s:%s%s:%d:%d:%s', at, string.char(96 + #seq_s), seq_s, j - i + 1, cum, ARGV[1])
      -- unpack takes at most a few thousand values at once.
      if #args == 2000 or j == #members then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
      i = j + 1
    end
    newest = redis.call('ZRANGE', key, '-1', '-1')[1]
    if newest then
      nt_s, nseq, ncum = match(newest, '^c(%d+):%a(%d+):%d+:(%d+):')
      -- DEL took the expiry, and a denial sets none: every entry left leaves within a window.
      redis.call('PEXPIRE', key, fmt('%d', window + (server_time and 0 or 60000)))
    end
  end
end

-- The live entries: their permits, the oldest one's fields, and the expired entries before it.
-- Fields stay strings until a number is needed: each parse is a strtod of ~500 instructions.
local live, expired, nt, lt, lw, lcum, lseq, oseq, marker = 0, 0, nil, nil, nil, nil, nil, nil, 0
if newest then
  nt, ncum = nt_s + 0, ncum + 0
  if nd then
    -- The newest entry's tail: the oldest live entry then, the first in the set, is still live,
    -- so every entry is, and an admission needs no more (a denial reads the oldest all the same:
    -- it needs its weight and seq).
    lt = nt - tonumber(nd, 16)
    if lt > edge then
      live = tonumber(nl, 16)
    else
      lt = nil
    end
  end
  if not lt or live + cost > limit then
    local o = redis.call('ZRANGE', key, '0', '0')[1]
    local ot, s, ow, ocum = match(o, ENTRY)
    if not ot then
      marker = 1
      o = redis.call('ZRANGE', key, '(-inf', '+inf', 'BYSCORE', 'LIMIT', 0, 1)[1]
      ot, s, ow, ocum = match(o, ENTRY)
    end
    oseq = s
    if nt > edge then
      ot = ot + 0
      if ot > edge then
        lt, lw, lcum, lseq = ot, ow + 0, ocum + 0, s
      else
        local l = redis.call('ZRANGE', key, fmt('(%d', edge), '+inf', 'BYSCORE', 'LIMIT', 0, 1)[1]
        lt, lseq, lw, lcum = match(l, ENTRY)
        lt, lw, lcum = lt + 0, lw + 0, lcum + 0
      end
      live = ncum - lcum + lw
    else
      lseq = nseq + 1
    end
    if lseq ~= oseq then
      expired = lseq - oseq
    end
    expired = expired + marker
  end
end

if live + cost > limit then
  -- The permits that must leave first: the oldest entries up to the one at seq `hi` hold them.
  local need, base = live + cost - limit, lcum - lw
  lseq, oseq = lseq + 0, oseq + 0
  local lo, hi = lseq, lseq
  local bt = lt
  if lw < need then
    hi = nseq + 0
    bt = nt
    while hi - lo > 1 do
      local mid = math.floor((lo + hi) / 2)
      local r = fmt('%d', marker + mid - oseq)
      local mt, _, _, mcum = match(redis.call('ZRANGE', key, r, r)[1], ENTRY)
      if mcum - base >= need then
        hi, bt = mid, mt + 0
      else
        lo = mid
      end
    end
  end
  local retry, reset = bt + window - now, nt + window - now
  if cost == 1 and hi == lseq and window <= 94906264 and reset >= 0 and reset <= window and retry <= window then
    return -1 - (reset * (window + 1) + retry)
  end
  return {math.max(limit - live, 0), reset, retry, lt + window - now}
end

if expired > 0 then
  redis.call('ZREMRANGEBYRANK', key, '0', fmt('%d', math.min(expired, 256) - 1))
end
-- The entry's time: now, or the newest one's when it is later (the clamp above); its weight is
-- ARGV[4] as the caller wrote it (a decimal integer).
local at, at_s, cum, seq_s = now, now_s, cost, '1'
if newest then
  cum, seq_s = ncum + cost, fmt('%d', nseq + 1)
  if nt > now then
    at, at_s = nt, nt_s
  end
end
-- Expiry, set once the entry is in (PEXPIRE on a missing key does nothing): on Redis' clock
-- (TIME), a quarter window past when the entry leaves, so that the next admissions of that
-- quarter find it set (the tail's e) and skip the call; on the caller's clock, from Redis' now,
-- as in sliding_log.lua (a minute of slack), with e = 0 (unknown).
local e, expire = 0, nil
if server_time then
  if ne then
    e = nt + tonumber(ne, 16) - at
  end
  if e < window then
    e = window + math.floor(window / 4)
    expire = fmt('%d', at + e)
  end
end
-- The tail (see the header) holds when no expired entry is left: the oldest live one is first.
-- Its fields are hexadecimal: tonumber(s, 16) reads them with strtoul, several times cheaper
-- than the strtod that reads a decimal.
local rest
if expired <= 256 then
  rest = fmt('%d:%x.%x.%x', cum, e, at - (lt or at), live + cost)
else
  rest = fmt('%d:', cum) .. ARGV[1]
end
redis.call('ZADD', key, at_s, 'c' .. at_s .. ':' .. string.char(96 + #seq_s) .. seq_s .. ':' .. ARGV[4] .. ':' .. rest)
if expire then
  redis.call('PEXPIREAT', key, expire)
elseif not server_time then
  redis.call('PEXPIRE', key, fmt('%d', window + at - now + 60000))
end
-- When remaining next grows: when the oldest live entry leaves (the new one's time is no
-- earlier than now; as in sliding_log.lua, no later than a window from now).
if not lt or lt > now then
  lt = now
end
return (limit - live - cost) * (window + 1) + lt + window - now
