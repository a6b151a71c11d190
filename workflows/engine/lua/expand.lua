-- Undo a compaction before a flow that had finished changes again (an operator's retry, a late
-- payment): every field plain again, the log a list again. The version is unchanged: the caller's
-- compare-and-set follows.
-- KEYS: flow, log, the partition's finished set. ARGV: 1 the version it was read at, 2 the fields (JSON
-- object of strings), 3 the log entries (JSON list of strings), oldest first, 4 the flow id, 5 now.
-- Returns 1, or 0 when the version moved meanwhile (the caller reads again).
--
-- The flow is listed for the packing pass again (workflows/engine/compact.py): its lookups were given an end
-- when it was packed, and every move out of a packed end passes here first. A flow that is going again
-- when the pass reads it has its lookups kept (whether or not its mover lived to keep them itself); one
-- still finished is packed again.
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
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
return 1
