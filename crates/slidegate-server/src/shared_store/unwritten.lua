-- slidegate: what every shared-rules script checks before it writes anything, prepended to
-- each (`store.rs`). A script that failed half-way would leave a change stored that no instance
-- is told of; these are the only failures left once the checks pass.
--
-- KEYS[1]  the state hash: absent or a hash, its `version` absent or a whole number that
--          HINCRBY can count on from
-- KEYS[2]  (when given) the overrides hash: absent or a hash
-- KEYS[3]  (when given) the expiries sorted set: absent or a sorted set
-- Returns  nothing; `unwritable(...)` names the first problem, or nil.
local function unwritable(...)
  local kinds = {'hash', 'hash', 'zset'}
  for i, key in ipairs(KEYS) do
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'none' and kind ~= kinds[i] then
      return 'slidegate: ' .. key .. ' is a ' .. kind .. ', not a ' .. kinds[i]
    end
  end
  local version = redis.call('HGET', KEYS[1], 'version')
  if version and not (string.match(version, '^%d+$') and #version <= 18) then
    return 'slidegate: the version of ' .. KEYS[1] .. ' is not a whole number'
  end
  -- Numbers the script reads from its arguments: each a whole number, or '' where allowed.
  for _, n in ipairs({...}) do
    if not string.match(n, '^%d+$') then
      return 'slidegate: an argument that must be a whole number is not'
    end
  end
  return nil
end
