-- Deliver a signal to a flow (states.lua, money.lua and events.lua are prepended). KEYS: flow, log, due, then the
-- state indexes waiting, ready, succeeded, failed, cancelled, needs_attention; the event stream.
-- ARGV: 1 flow id, 2 signal name, 3 signal (JSON object with name, payload, t and, when it reports a
--       payment taken, paid), 4 now, 5 log entry of a resume (JSON), 6 due time of the resumed flow
--       (now, or later when the caller sends the step itself), 7 who delivers it, 8 "1" to emit the
--       merchant events of a late payment (payment.late, flow.needs_attention), 9 the request's token
--       ("" none): kept with the answer in the record's 'sreq' (token and answer), so that this signal
--       sent again after its answer was lost (a failover) answers as the first did and is not kept twice
--       (resend-safe, workflows/engine/scripts.py).
-- Returns "missing"; "packed" (a finished flow compacted by workflows/engine/compact.py: the caller expands it
-- and asks again, so that this script reads every field as written); "finished" (ended, nothing to do);
-- "late_payment" (ended without this payment:
-- kept, and the flow moved to needs_attention, see money.lua); "resumed" (it was waiting for it); or
-- "stored" (kept until the flow waits for it). Storing does not change the version: a step in flight
-- completes normally and its completion then finds the signal (see transition.lua). A signal reporting a
-- payment (paid) that a kept signal already reports is not kept twice: the gateway's retried notification,
-- or a reconciliation run again over the same day, tells the flow nothing new.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'missing'
end
if redis.call('HEXISTS', KEYS[1], 'z') == 1 then
  return 'packed'
end
if ARGV[9] ~= '' then
  local sent = redis.call('HGET', KEYS[1], 'sreq')
  if sent and string.sub(sent, 1, #ARGV[9] + 1) == ARGV[9] .. ' ' then
    return string.sub(sent, #ARGV[9] + 2)
  end
end
local function answered(result)
  if ARGV[9] ~= '' then
    redis.call('HSET', KEYS[1], 'sreq', ARGV[9] .. ' ' .. result)
  end
  return result
end
local state = redis.call('HGET', KEYS[1], 'state')
local signal = cjson.decode(ARGV[3])
if TERMINAL[state] then
  local outcome = redis.call('HGET', KEYS[1], 'outcome')
  if not unaccounted(signal['paid'], state, outcome) then
    return 'finished'
  end
  assert(may_move(state, 'needs_attention'), 'a finished flow must be able to show a late payment')
  local indexes = {succeeded = KEYS[6], failed = KEYS[7], cancelled = KEYS[8]}
  keep_signal(KEYS[1], ARGV[3], signal['paid'] ~= nil)
  local version = tonumber(redis.call('HGET', KEYS[1], 'version')) + 1
  redis.call('HSET', KEYS[1], 'state', 'needs_attention', 'version', version, 'updated', ARGV[4],
    'error', late_payment_error(signal['paid'], state))
  redis.call('HDEL', KEYS[1], 'due')
  redis.call('ZREM', indexes[state], ARGV[1])
  redis.call('ZADD', KEYS[9], ARGV[4], ARGV[1])
  local what = late_payment_what(signal['paid'], 'ended ' .. state)
  redis.call('RPUSH', KEYS[2], cjson.encode({t = tonumber(ARGV[4]), from = state, to = 'needs_attention',
    step = redis.call('HGET', KEYS[1], 'step') or '', by = ARGV[7], what = what}))
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
  if ARGV[8] == '1' then
    emit(KEYS[10], KEYS[1], ARGV[1], 'payment.late', ARGV[4], {operation = signal['paid'], endedAs = state})
    local kind, data = state_event(KEYS[1], 'needs_attention', what)
    emit(KEYS[10], KEYS[1], ARGV[1], kind, ARGV[4], data)
  end
  return answered('late_payment')
end
keep_signal(KEYS[1], ARGV[3], signal['paid'] ~= nil)
if state ~= 'waiting' then
  return answered('stored')
end
local wait = redis.call('HGET', KEYS[1], 'wait')
local awaited = false
if wait then
  for _, name in ipairs(cjson.decode(wait)['signals']) do
    if name == ARGV[2] then awaited = true end
  end
end
if not awaited then
  return answered('stored')
end
local version = tonumber(redis.call('HGET', KEYS[1], 'version')) + 1
redis.call('HSET', KEYS[1], 'state', 'ready', 'version', version, 'updated', ARGV[4], 'due', ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[5])
return answered('resumed')
