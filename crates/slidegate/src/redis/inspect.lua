-- slidegate: read one sliding-log key without changing it.
--
-- KEYS[1]  the key's sorted set (see sliding_log.lua)
-- ARGV[1]  window in ms
-- ARGV[2]  now in ms (optional, "" or absent: Redis TIME)
-- ARGV[3]  how many of the newest admissions' times to return as well (optional; the caller
--          bounds it, MAX_TIMELINE)
-- Returns  {count in window, oldest admission ms or -1, reset_after_ms}, then, with ARGV[3], the
--          times of the newest ARGV[3] admissions in the window, newest first (read from the
--          members, '<time ms>:<id>[:<i>]', one per permit)
local key = KEYS[1]
local window = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local edge = now - window
local count = redis.call('ZCOUNT', key, string.format('(%d', edge), '+inf')
if count == 0 then
  return {0, -1, 0}
end
local oldest = redis.call('ZRANGE', key, string.format('(%d', edge), '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local reply = {count, tonumber(oldest[2]), tonumber(newest[2]) + window - now}
local times = tonumber(ARGV[3])
if times and times > 0 then
  local members = redis.call('ZRANGE', key, '+inf', string.format('(%d', edge), 'BYSCORE', 'REV', 'LIMIT', 0, times)
  for _, m in ipairs(members) do
    reply[#reply + 1] = tonumber(string.match(m, '^(%d+)'))
  end
end
return reply
