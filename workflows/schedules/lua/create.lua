-- Create a schedule unless it exists. KEYS: record, log, due, state index, all-schedules index, the
-- tombstone of its create key (ScheduleKeys.tombstone).
-- ARGV: 1 id, 2 fields (JSON object of strings), 3 input hash, 4 due score ("" = not due), 5 log entry
-- (JSON), 6 created. Returns {1, ""} when created, {0, <stored input hash>} when it already existed,
-- {2, <when it ended>} when a schedule of this id (its key) ended and was removed, while its tombstone
-- lives: nothing is written (its occurrences' flow and order ids would be the removed one's).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('HGET', KEYS[1], 'input_hash') or ''}
end
if redis.call('EXISTS', KEYS[6]) == 1 then
  return {2, redis.call('GET', KEYS[6])}
end
for name, value in pairs(cjson.decode(ARGV[2])) do
  redis.call('HSET', KEYS[1], name, value)
end
redis.call('HSET', KEYS[1], 'input_hash', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
end
redis.call('ZADD', KEYS[4], ARGV[6], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[6], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[5])
return {1, ''}
