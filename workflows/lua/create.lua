-- Create a flow unless it exists (events.lua is prepended). KEYS: flow, log, due, state index, kind
-- index, event stream.
-- ARGV: flow id, now, fields (JSON object of strings), log entry (JSON), input hash, due time,
-- "1" to emit flow.created.
-- Returns {1, ""} when created, {0, <stored input hash>} when the flow already existed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('HGET', KEYS[1], 'input_hash') or ''}
end
local fields = cjson.decode(ARGV[3])
for name, value in pairs(fields) do
  redis.call('HSET', KEYS[1], name, value)
end
redis.call('HSET', KEYS[1], 'input_hash', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[2], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[4])
if ARGV[7] == '1' then
  local run_at = cjson.null
  if fields['state'] == 'sleeping' then
    run_at = tonumber(ARGV[6])
  end
  emit(KEYS[6], KEYS[1], ARGV[1], 'flow.created', ARGV[2], {state = fields['state'], step = fields['step'], runAt = run_at})
end
return {1, ''}
