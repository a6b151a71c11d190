-- Compare-and-set one transition of a flow.
-- KEYS: flow, log, due, old-state index, new-state index, ready index, cancelled index.
-- ARGV: 1 flow id, 2 expected version, 3 new state, 4 fields (JSON object; JSON null deletes),
--       5 due score ("" removes the flow from the due set), 6 log entry (JSON), 7 now,
--       8 ttl seconds ("" keeps the record forever), 9 awaited signal names (JSON list, for waits),
--       10 ttl seconds of a finished flow (used when a cancel request turns this move into a cancel),
--       11 the input without card secrets ("" when there are none), written when the flow ends.
-- Returns {new version, final state}, or {0, current state} when the version did not match.
local current = redis.call('HGET', KEYS[1], 'version')
if current ~= ARGV[2] then
  return {0, redis.call('HGET', KEYS[1], 'state') or ''}
end
local state = ARGV[3]
local due = ARGV[5]
local idx = KEYS[5]
local entry = ARGV[6]
local fields = cjson.decode(ARGV[4])
if state == 'waiting' then
  -- A signal that arrived while the step ran must not be slept through: resume at once.
  local awaited = {}
  for _, name in ipairs(cjson.decode(ARGV[9])) do awaited[name] = true end
  local keys = redis.call('HKEYS', KEYS[1])
  for _, key in ipairs(keys) do
    -- (a signal this very step consumed is deleted below: it must not wake the flow again)
    if string.sub(key, 1, 4) == 'sig:' and fields[key] ~= cjson.null then
      local signal = cjson.decode(redis.call('HGET', KEYS[1], key))
      if awaited[signal['name']] then
        state = 'ready'
        due = ARGV[7]
        idx = KEYS[6]
        local log = cjson.decode(entry)
        log['to'] = 'ready'
        log['what'] = (log['what'] or '') .. ' (a signal was already there)'
        entry = cjson.encode(log)
        break
      end
    end
  end
end
local ttl = ARGV[8]
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' and
   (state == 'ready' or state == 'running' or state == 'retrying' or state == 'waiting' or state == 'sleeping') then
  -- Cancelled while a step ran: keep what the step did, then stop at this step boundary.
  state = 'cancelled'
  due = ''
  idx = KEYS[7]
  ttl = ARGV[10]
  local log = cjson.decode(entry)
  log['to'] = 'cancelled'
  log['what'] = (log['what'] or '') .. ' (then cancelled as requested)'
  entry = cjson.encode(log)
end
for name, value in pairs(fields) do
  if value == cjson.null then
    redis.call('HDEL', KEYS[1], name)
  else
    redis.call('HSET', KEYS[1], name, value)
  end
end
local version = tonumber(current) + 1
redis.call('HSET', KEYS[1], 'state', state, 'version', version, 'updated', ARGV[7])
if due == '' then
  redis.call('HDEL', KEYS[1], 'due')
  redis.call('ZREM', KEYS[3], ARGV[1])
else
  redis.call('HSET', KEYS[1], 'due', due)
  redis.call('ZADD', KEYS[3], due, ARGV[1])
end
if KEYS[4] ~= idx then
  redis.call('ZREM', KEYS[4], ARGV[1])
end
redis.call('ZADD', idx, ARGV[7], ARGV[1])
redis.call('RPUSH', KEYS[2], entry)
if ARGV[11] ~= '' and (state == 'succeeded' or state == 'failed' or state == 'cancelled') then
  redis.call('HSET', KEYS[1], 'input', ARGV[11])
end
if ttl == '' then
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
else
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
end
return {version, state}
