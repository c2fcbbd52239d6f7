-- slidegate: read one sliding-log key without changing it.
--
-- KEYS[1]  the key's sorted set: one member per permit (sliding_log.lua) or counted entries
--          (counted_log.lua), told apart by the newest member
-- ARGV[1]  window in ms
-- ARGV[2]  now in ms (optional, "" or absent: Redis TIME)
-- ARGV[3]  how many of the newest admitted permits' times to return as well (optional; the
--          caller bounds it, MAX_TIMELINE)
-- Returns  {permits in window, oldest admission ms or -1, reset_after_ms}, then, with ARGV[3],
--          the times of the newest ARGV[3] permits in the window, newest first (a counted
--          entry's time once per permit it holds)
local key = KEYS[1]
local window = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local edge = string.format('(%d', now - window)
local ENTRY = '^c(%d+):%a%d+:(%d+):(%d+):'
local oldest = redis.call('ZRANGE', key, edge, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
if #oldest == 0 then
  return {0, -1, 0}
end
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local count
local _, _, ncum = string.match(newest[1], ENTRY)
if ncum then
  local _, ow, ocum = string.match(oldest[1], ENTRY)
  count = ncum - ocum + ow
else
  count = redis.call('ZCOUNT', key, edge, '+inf')
end
local reply = {count, tonumber(oldest[2]), tonumber(newest[2]) + window - now}
local times = tonumber(ARGV[3])
if times and times > 0 then
  -- At most `times` entries hold the newest `times` permits.
  local members = redis.call('ZRANGE', key, '+inf', edge, 'BYSCORE', 'REV', 'LIMIT', 0, times)
  for _, m in ipairs(members) do
    local at, w = string.match(m, ENTRY)
    at, w = tonumber(at or string.match(m, '^%d+')), tonumber(w) or 1
    if not ncum then
      w = 1
    end
    for _ = 1, math.min(w, times - #reply + 3) do
      reply[#reply + 1] = at
    end
    if #reply - 3 >= times then
      break
    end
  end
end
return reply
