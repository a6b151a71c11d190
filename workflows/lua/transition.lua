-- Compare-and-set one transition of a flow (money.lua and events.lua are prepended).
-- KEYS: flow, log, due, old-state index, new-state index, ready index, cancelled index,
--       needs_attention index, event stream, the finished set (flows to pack: workflows/compact.py),
--       then one lookup key per gateway operation id this change records (Keys.operation: set to the
--       flow id, kept for the retention time; the console's search by operation id).
-- ARGV: 1 flow id, 2 expected version, 3 new state, 4 fields (JSON object; JSON null deletes),
--       5 due score ("" removes the flow from the due set), 6 log entry (JSON), 7 now,
--       8 ttl seconds ("" keeps the record forever), 9 signal names the completing step awaits (JSON
--       list: for a wait, or a wait step ending failed), 10 ttl seconds of a finished flow (used when
--       a cancel request turns this move into a cancel), 11 the input without card secrets ("" when
--       there are none), written when the flow ends, 12 "1" to emit the merchant events of the move
--       (flow.waiting when it starts to wait, flow.succeeded/failed/cancelled/needs_attention,
--       payment.late), 13 the payment this very completion recorded (JSON, or ""): ending cancelled
--       (a cancel request) or failed with it is money unaccounted too.
-- Returns {new version, final state}, or {0, current state} when the version did not match. The final
-- state differs from the one asked for when: a signal the step awaits is already there (ready: run
-- the step again to read it); a cancel was requested (cancelled, the request used up); or the flow
-- would end with a reported payment unaccounted (needs_attention, see money.lua).
local current = redis.call('HGET', KEYS[1], 'version')
if current ~= ARGV[2] then
  return {0, redis.call('HGET', KEYS[1], 'state') or ''}
end
local state = ARGV[3]
local due = ARGV[5]
local idx = KEYS[5]
local ttl = ARGV[8]
local fields = cjson.decode(ARGV[4])
local log = cjson.decode(ARGV[6])
local was_waiting = redis.call('HEXISTS', KEYS[1], 'wait') == 1
local rewritten = false  -- the log entry is re-encoded only when this script changed it
if state == 'waiting' or state == 'failed' then
  -- A signal that arrived while the step ran must not be slept through, nor failed past: run again.
  local awaited = {}
  for _, name in ipairs(cjson.decode(ARGV[9])) do awaited[name] = true end
  for _, key in ipairs(redis.call('HKEYS', KEYS[1])) do
    -- (a signal this very step consumed is deleted below: it must not wake the flow again)
    if string.sub(key, 1, 4) == 'sig:' and fields[key] ~= cjson.null then
      local signal = cjson.decode(redis.call('HGET', KEYS[1], key))
      if awaited[signal['name']] then
        if state == 'failed' then
          fields['outcome'] = nil  -- not failed after all, perhaps: the run that reads the signal decides
          fields['error'] = nil
        end
        state = 'ready'
        due = ARGV[7]
        idx = KEYS[6]
        ttl = ''
        log['to'] = 'ready'
        rewritten = true
        log['what'] = (log['what'] or '') .. ' (a signal was already there: read it first)'
        break
      end
    end
  end
end
local cancel_requested = redis.call('HGET', KEYS[1], 'cancel_requested') == '1'
if fields['cancel_requested'] ~= nil then
  cancel_requested = fields['cancel_requested'] == '1'  -- withdrawn (an operator's retry) or made here
end
-- A retry whose call may have reached the gateway (reconcile first) is no step boundary: its read is
-- still owed (claim.lua claims it, and the run only reads), or money taken would end cancelled.
local read_owed = state == 'retrying' and fields['reconcile'] == '1'
if cancel_requested and not read_owed and
   (state == 'ready' or state == 'running' or state == 'retrying' or state == 'waiting' or state == 'sleeping') then
  -- Cancelled while a step ran: keep what the step did, then stop at this step boundary.
  state = 'cancelled'
  due = ''
  idx = KEYS[7]
  ttl = ARGV[10]
  log['to'] = 'cancelled'
  rewritten = true
  log['what'] = (log['what'] or '') .. ' (then cancelled as requested)'
end
local outcome = fields['outcome']
if outcome == cjson.null or outcome == nil then
  outcome = redis.call('HGET', KEYS[1], 'outcome')
end
local paid = unaccounted_signal(KEYS[1], fields, state, outcome)
if not paid and ARGV[13] ~= '' and (state == 'cancelled' or state == 'failed') then
  paid = cjson.decode(ARGV[13])
end
local ended = state
if paid then
  fields['error'] = late_payment_error(paid, state)
  log['what'] = (log['what'] or '') .. '; but ' .. late_payment_what(paid, 'would end ' .. state)
  state = 'needs_attention'
  due = ''
  idx = KEYS[8]
  ttl = ''
  log['to'] = 'needs_attention'
  rewritten = true
end
for name, value in pairs(fields) do
  if value == cjson.null then
    redis.call('HDEL', KEYS[1], name)
  else
    redis.call('HSET', KEYS[1], name, value)
  end
end
if state == 'cancelled' then
  redis.call('HDEL', KEYS[1], 'cancel_requested')  -- used up: a later retry does not cancel again
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
redis.call('RPUSH', KEYS[2], rewritten and cjson.encode(log) or ARGV[6])
if state == 'succeeded' or state == 'failed' or state == 'cancelled' then
  if ARGV[11] ~= '' then
    redis.call('HSET', KEYS[1], 'input', ARGV[11])
  end
  redis.call('ZADD', KEYS[10], ARGV[7], ARGV[1])
end
for i = 11, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'EX', ARGV[10])
end
if ttl == '' then
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
else
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
end
if ARGV[12] == '1' then
  if paid then
    emit(KEYS[9], KEYS[1], ARGV[1], 'payment.late', ARGV[7], {operation = paid, endedAs = ended})
  end
  local kind, data = state_event(KEYS[1], state, log['what'])
  if kind then
    emit(KEYS[9], KEYS[1], ARGV[1], kind, ARGV[7], data)
  elseif state == 'waiting' and not was_waiting then
    local wait = event_json(fields['wait']) or {}
    emit(KEYS[9], KEYS[1], ARGV[1], 'flow.waiting', ARGV[7], {customerUrl = redis.call('HGET', KEYS[1], 'customer_url') or cjson.null,
      deadline = wait['deadline'] or cjson.null, signals = wait['signals'] or cjson.null, step = wait['step'] or cjson.null})
  end
end
return {version, state}
