-- A step of a capped fairness key ended, or the dispatcher looks for room freed by lapsed places: the
-- ending claim's place is given back (only its own: a run that lost its lease gives back nothing, the
-- flow's place is its new claim's), lapsed places are dropped, and the oldest held flows take the room
-- there is (admitted here; the caller sends them).
-- KEYS: the key's running set, its held set, its owners. ARGV: flow id, now, lapse time, cap, the
-- ending claim's token ('' for none: a dispatcher's look only).
-- Returns the ids admitted. A caller lost before sending them leaves them due (their due entries).
if ARGV[5] ~= '' and redis.call('HGET', KEYS[3], ARGV[1]) == ARGV[5] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
for i = 1, #lapsed do
  redis.call('ZREM', KEYS[1], lapsed[i])
  redis.call('HDEL', KEYS[3], lapsed[i])
end
local room = tonumber(ARGV[4]) - redis.call('ZCARD', KEYS[1])
if room <= 0 then
  return {}
end
local popped = redis.call('ZPOPMIN', KEYS[2], room)
local ids = {}
for i = 1, #popped, 2 do
  redis.call('ZADD', KEYS[1], ARGV[3], popped[i])
  redis.call('HDEL', KEYS[3], popped[i])
  ids[#ids + 1] = popped[i]
end
return ids
