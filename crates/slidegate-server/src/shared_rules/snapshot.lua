-- slidegate: everything an instance applies, read at one version.
--
-- KEYS[1]  the state hash (see push_rules.lua)
-- KEYS[2]  the overrides hash (see set_override.lua)
-- Returns  {{version, rules, rules_version, pushed_at_ms, pushed_from}, {field, JSON, ...}},
--          the state's fields false (nil) when unset.
-- Cluster  two keys of one hash tag, so one slot.
--
-- One script, so no change lands between the version and what it covers. It reads every
-- override: with 100,000 (max_overrides' default) this holds Redis for tens of milliseconds,
-- once per instance start and per reconnection.
return {
  redis.call('HMGET', KEYS[1], 'version', 'rules', 'rules_version', 'pushed_at_ms', 'pushed_from'),
  redis.call('HGETALL', KEYS[2]),
}
