-- Compact a finished flow's record: its cold fields and its log become one compressed value.
-- KEYS: flow, log, the partition's finished set. ARGV: 1 flow id, 2 the version it was read at,
-- 3 the fields to keep plain (JSON object of strings), 4.. the packed value in chunks (bytes), stored as
-- fields z, z1, z2... (each short enough for Redis to keep the hash as a compact listpack).
-- Returns 1 when compacted, 0 when the flow changed since it was read (a late payment moved it): it is
-- left as it is, and out of the finished set (it will be put back when it finishes again).
redis.call('ZREM', KEYS[3], ARGV[1])
local data = redis.call('HMGET', KEYS[1], 'version', 'state')
if data[1] ~= ARGV[2] or (data[2] ~= 'succeeded' and data[2] ~= 'failed' and data[2] ~= 'cancelled') then
  return 0
end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
local plain = cjson.decode(ARGV[3])
for name, value in pairs(plain) do
  redis.call('HSET', KEYS[1], name, value)
end
for i = 4, #ARGV do
  local name = 'z'
  if i > 4 then
    name = 'z' .. (i - 4)
  end
  redis.call('HSET', KEYS[1], name, ARGV[i])
end
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
