-- Mark a schedule's open attempts as created (their flows were just started), compare-and-set on the
-- version: the scheduler's second write of a batch. Only the open attempts change (no state, due score,
-- history or event), so nothing else is sent or rewritten. KEYS: record. ARGV: 1 expected version,
-- 2 open attempts (JSON), 3 now. Returns the new version, or 0 when another writer got there first.
local current = redis.call('HGET', KEYS[1], 'version')
if current ~= ARGV[1] then
  return 0
end
local version = tonumber(current) + 1
redis.call('HSET', KEYS[1], 'open', ARGV[2], 'version', version, 'updated', ARGV[3])
return version
