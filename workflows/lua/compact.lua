-- Compact a finished flow's record: its cold fields and its log become one compressed value (states.lua
-- is prepended).
-- KEYS: flow, log, the partition's finished set, a scratch key in the flow's slot (Keys.packing).
-- ARGV: 1 flow id, 2 the version it was read at, 3 the fields to keep plain (JSON object of strings),
-- 4.. the packed value in chunks (bytes), stored as fields z, z1, z2... (each short enough for Redis to
-- keep the hash as a compact listpack).
-- Returns 1 when compacted, 0 when the flow changed since it was read (a late payment moved it): it is
-- left as it is, and out of the finished set unless it has finished again meanwhile (then the next pass
-- packs it).
--
-- The packed record is written anew, under the scratch key, then renamed over the record: a hash that
-- once held a long field stays a hashtable however many fields are removed, and only a new one is a
-- listpack. Nothing is deleted before the new record exists: in a Redis Cluster whose slot is moving, a
-- node refuses a script that would create a key it does not hold (TRYAGAIN before it runs, as the
-- scratch key is declared), while a refusal half-way through a script keeps what it wrote before.
local data = redis.call('HMGET', KEYS[1], 'version', 'state')
if data[1] ~= ARGV[2] or not TERMINAL[data[2]] then
  if not TERMINAL[data[2]] then
    -- Back in flight (a late payment): out of the set; it is put back when it finishes again. One that
    -- has finished again since it was read stays in it, for the next pass to read anew.
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  return 0
end
redis.call('DEL', KEYS[4])
for name, value in pairs(cjson.decode(ARGV[3])) do
  redis.call('HSET', KEYS[4], name, value)
end
for i = 4, #ARGV do
  local name = 'z'
  if i > 4 then
    name = 'z' .. (i - 4)
  end
  redis.call('HSET', KEYS[4], name, ARGV[i])
end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('RENAME', KEYS[4], KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
