-- Record one delivery attempt and what follows it, in one atomic step.
-- KEYS: 1 the deliveries' due set, 2 their state hash, 3 the endpoint's attempts list (newest first).
-- ARGV: 1 member (entry id|endpoint id), 2 the attempt (JSON), 3 next due score ("" = no more: delivered,
--       given up or dropped), 4 attempts kept, 5 attempts made before this one (a stale duplicate
--       whose count no longer matches only logs its attempt).
-- Returns 1 when the delivery's state moved, 0 when only the attempt was logged.
redis.call('LPUSH', KEYS[3], ARGV[2])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then
  return 0
end
local state = cjson.decode(raw)
if tonumber(state['n']) ~= tonumber(ARGV[5]) then
  return 0
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  state['n'] = tonumber(state['n']) + 1
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(state))
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
