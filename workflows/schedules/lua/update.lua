-- Compare-and-set one change of a schedule. KEYS: record, log, due, old-state index, new-state index,
-- the merchant event stream.
-- ARGV: 1 id, 2 expected version, 3 new state, 4 the fields that changed (JSON object of strings), 5 due score ("" removes
-- the schedule from the due set), 6 log entries (JSON list of JSON strings), 7 now, 8 created,
-- 9 merchant events of the change (JSON list of JSON strings): written here, with it, or not at all.
-- Returns the new version, or 0 when the version did not match (another writer got there first).
local current = redis.call('HGET', KEYS[1], 'version')
if current ~= ARGV[2] then
  return 0
end
local version = tonumber(current) + 1
local fields = {'state', ARGV[3], 'version', version, 'updated', ARGV[7]}
for name, value in pairs(cjson.decode(ARGV[4])) do
  fields[#fields + 1] = name
  fields[#fields + 1] = value
end
redis.call('HSET', KEYS[1], unpack(fields))
if ARGV[5] == '' then
  redis.call('ZREM', KEYS[3], ARGV[1])
else
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
end
if KEYS[4] ~= KEYS[5] then
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('ZADD', KEYS[5], ARGV[8], ARGV[1])
end
for _, entry in ipairs(cjson.decode(ARGV[6])) do
  redis.call('RPUSH', KEYS[2], entry)
end
for _, event in ipairs(cjson.decode(ARGV[9])) do
  redis.call('XADD', KEYS[6], '*', 'e', event)
end
return version
