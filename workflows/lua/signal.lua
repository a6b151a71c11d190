-- Deliver a signal to a flow. KEYS: flow, log, due, waiting index, ready index.
-- ARGV: 1 flow id, 2 signal name, 3 signal (JSON object with name, payload, t), 4 now, 5 log entry,
--       6 due time of the resumed flow (now, or later when the caller sends the step itself).
-- Returns "missing", "finished", "resumed" (the flow was waiting for it) or "stored" (kept until the
-- flow waits for it). Storing does not change the version: a step in flight completes normally and
-- its wait then finds the signal (see transition.lua).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'missing'
end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'succeeded' or state == 'failed' or state == 'cancelled' then
  return 'finished'
end
local seq = redis.call('HINCRBY', KEYS[1], 'sigseq', 1)
redis.call('HSET', KEYS[1], 'sig:' .. seq, ARGV[3])
if state ~= 'waiting' then
  return 'stored'
end
local wait = redis.call('HGET', KEYS[1], 'wait')
local awaited = false
if wait then
  for _, name in ipairs(cjson.decode(wait)['signals']) do
    if name == ARGV[2] then awaited = true end
  end
end
if not awaited then
  return 'stored'
end
local version = tonumber(redis.call('HGET', KEYS[1], 'version')) + 1
redis.call('HSET', KEYS[1], 'state', 'ready', 'version', version, 'updated', ARGV[4], 'due', ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[5])
return 'resumed'
