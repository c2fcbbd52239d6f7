-- slidegate: the effective limit under a warm-up, for the charge scripts, which run with this
-- prepended (check.lua has its own, inline in its loop). src/quota.rs, WarmUp::limit_at:
-- limit * f / 1000 rounded down, at least 1, f = cold + (1000 - cold) * min(elapsed, period) /
-- period rounded down; integers below 2^53, exact in Lua's doubles. `since` is the ramp's start
-- (nil: none recorded, a key warm for as long as it has held permits), `idle` whether the key
-- holds nothing, so that the ramp starts over now.
local function warm_limit(limit, period, cold, since, idle, now)
  if period == 0 then
    return limit
  end
  if idle then
    since = now
  elseif not since then
    since = now - period
  end
  local f = cold + math.floor((1000 - cold) * math.min(math.max(now - since, 0), period) / period)
  return math.max(1, math.floor(limit * f / 1000))
end
