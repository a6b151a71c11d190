-- Undo a compaction before a flow that had finished changes again (an operator's retry): every field
-- plain again, the log a list again. The version is unchanged: the caller's compare-and-set follows.
-- KEYS: flow, log. ARGV: 1 the version it was read at, 2 the fields (JSON object of strings),
-- 3 the log entries (JSON list of strings), oldest first.
-- Returns 1, or 0 when the version moved meanwhile (the caller reads again).
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] then
  return 0
end
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if name == 'z' or string.match(name, '^z%d+$') then
    redis.call('HDEL', KEYS[1], name)
  end
end
for name, value in pairs(cjson.decode(ARGV[2])) do
  if redis.call('HEXISTS', KEYS[1], name) == 0 then
    redis.call('HSET', KEYS[1], name, value)
  end
end
local entries = cjson.decode(ARGV[3])
for i = #entries, 1, -1 do
  redis.call('LPUSH', KEYS[2], entries[i])
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return 1
