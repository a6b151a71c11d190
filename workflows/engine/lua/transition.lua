-- Compare-and-set one transition of a flow (states.lua, money.lua, events.lua and inflight.lua are prepended).
-- KEYS: flow, log, due, old-state index, new-state index, ready index, cancelled index,
--       needs_attention index, event stream, the finished set (flows to pack: workflows/engine/compact.py),
--       the retrying index, then one lookup key per gateway operation id this change records first
--       (Keys.operation: set to the flow id with no expiry, the console's search by operation id; it
--       lives as long as the flow: listed in the record's ``ops``, it gets the record's retention once
--       the flow has finished, workflows/engine/orders.py).
-- ARGV: 1 flow id, 2 expected version, 3 new state, 4 fields (JSON object; JSON null deletes),
--       5 due score ("" removes the flow from the due set), 6 log entry (JSON), 7 now,
--       8 signal names the completing step awaits (JSON list: for a wait, or a wait step ending
--       failed), 9 the input without card secrets ("" when there are none), written when the flow
--       ends, 10 "1" to emit the merchant events of the move (flow.waiting when it starts to wait,
--       flow.succeeded/failed/cancelled/needs_attention, payment.late), 11 the payment this very
--       completion recorded (JSON, or ""): money the gateway took, which no cancel undoes and no
--       failure may hide (kept as a signal when the step stops for a person over it: a LatePayment it
--       found), 12 the state the caller read the flow in, 13 "1" when the caller's record already had a
--       cancel requested (its step ran only to read for it).
-- Resend-safe (workflows/engine/scripts.py): the caller's request token is one of the fields ('treq'), so this
-- change sent again after its answer was lost (a failover) finds it written and answers with the record
-- as it is ({version, state, 1}: read it back), not as stale.
-- The record and log never expire after this script: a flow that finishes is listed in the finished set
-- and the packing pass gives it its end (the retention, or longer while its customer can pay), together
-- with its lookups.
-- Returns {new version, final state, rewritten}, {0, current state, 0} when the version or the state did
-- not match (stale: another writer got there first), or {-1, state, operation id} for a cancel of a flow
-- whose payment succeeded (refused: money moved, nothing undoes it). The final
-- state differs from the one asked for when:
-- * a signal the step awaits is already there (ready: run the step again to read it);
-- * money is in flight (``unsettled``, written by claim.lua, kept until a completion reports the
--   gateway's answer): a cancel or a failure waits for a read of the gateway. A cancel becomes a request
--   (``cancel_requested``; asked directly, the flow is made ready now so that its step reads); a
--   failure becomes ``retrying`` now with the end it owes kept as ``ending``. This is the one home of
--   the rule "no flow ends cancelled or failed while its money may be at the gateway";
-- * a cancel was requested and nothing is in flight: cancelled (the request used up; a failure, say the
--   decline the read found, is cancelled too: the operator's stop wins over dunning), unless this very
--   completion recorded a payment taken: then the cancel is refused (the money moved) and the flow
--   goes on as its step said;
-- * the flow would end with a reported payment unaccounted (needs_attention, see money.lua).
-- What this script reads of the record before it writes, in one HMGET (absent fields are false, as HGET
-- answers them): ``stored`` serves ``after`` below and the merchant events, so that the change reads the
-- record once instead of field by field.
local READ = {'version', 'state', 'wait', 'unsettled', 'cancel_requested', 'outcome', 'money_moved', 'keep_until',
  'error', 'step', 'kind', 'order_id', 'terminal'}
local stored = {}
for i, value in ipairs(redis.call('HMGET', KEYS[1], unpack(READ))) do
  stored[READ[i]] = value
end
local current = stored['version']
local old_state = stored['state']
-- The version and the state together: after Redis lost its last writes a version can come round again
-- (a claim lost, then a cancel of the flow as it was), and a completion of that lost claim must not
-- move the flow the cancel ended.
if current ~= ARGV[2] or old_state ~= ARGV[12] then
  local token = cjson.decode(ARGV[4])['treq']
  if type(token) == 'string' and token ~= '' and redis.call('HGET', KEYS[1], 'treq') == token then
    return {tonumber(current), old_state, 1}
  end
  return {0, old_state or '', 0}
end
if ARGV[3] == 'cancelled' then
  -- A flow whose payment succeeded (a second payment beside it made it a person's again), or whose
  -- money an earlier step recorded taken (``money_moved``: a charge EXECUTED, its read-back still to
  -- come), is never cancelled: its money moved. Refused: {-1, state, operation id}.
  local before = event_json(stored['outcome']) or {}
  if before['result'] == 'succeeded' then
    return {-1, old_state, tostring((before['operation'] or {})['operationId'])}
  end
  local moved = event_json(stored['money_moved'])
  if moved then
    return {-1, old_state, tostring(moved['operationId'])}
  end
end
local state = ARGV[3]
local due = ARGV[5]
local idx = KEYS[5]
local fields = cjson.decode(ARGV[4])
local log = cjson.decode(ARGV[6])
local was_waiting = stored['wait'] ~= false
local rewritten = false  -- the log entry is re-encoded only when this script changed it
local paid = nil
if ARGV[11] ~= '' then
  paid = cjson.decode(ARGV[11])
end

-- The record's field names as read before this change (one HKEYS, at the first need): its kept
-- signals (sig:<n>) are judged by them. Of those, the change deletes some (``fields``, JSON null); a
-- signal kept by this very change (keep_signal, for needs_attention only) is never among the ones read.
local names = nil
local function field_names()
  if not names then
    names = redis.call('HKEYS', KEYS[1])
  end
  return names
end

-- The value a field has once this change is written (false: absent). (``stored`` stays true of the
-- fields this change does not name: the script writes no other field of READ but the state, version and
-- keep_until of its last HSET and the cancel request of its last HDEL, which nothing reads after.)
local function after(name)
  local value = fields[name]
  if value == cjson.null then
    return false
  end
  if value ~= nil then
    return value
  end
  if stored[name] ~= nil then
    return stored[name]
  end
  return redis.call('HGET', KEYS[1], name)
end

local function move(to, to_index, note)
  state = to
  idx = to_index
  log['to'] = to
  rewritten = true
  log['what'] = (log['what'] or '') .. note
end

if state == 'waiting' or state == 'failed' then
  -- A signal that arrived while the step ran must not be slept through, nor failed past: run again.
  local awaited = {}
  for _, name in ipairs(cjson.decode(ARGV[8])) do awaited[name] = true end
  for _, key in ipairs(field_names()) do
    -- (a signal this very step consumed is deleted below: it must not wake the flow again)
    if string.sub(key, 1, 4) == 'sig:' and fields[key] ~= cjson.null then
      local signal = cjson.decode(redis.call('HGET', KEYS[1], key))
      if awaited[signal['name']] then
        if state == 'failed' then
          fields['outcome'] = nil  -- not failed after all, perhaps: the run that reads the signal decides
          fields['error'] = nil
        elseif not was_waiting then
          fields['wait'] = nil  -- it never waited: its real wait, once it reads the signal, is announced
        end
        due = ARGV[7]
        move('ready', KEYS[6], ' (a signal was already there: read it first)')
        break
      end
    end
  end
end

local unsettled = after('unsettled')
local cancel_requested = after('cancel_requested') == '1'
if in_flight(unsettled) then
  local what = 'money may be in flight'
  local ok, inflight = pcall(cjson.decode, unsettled)
  if ok and type(inflight) == 'table' then
    what = what .. ' (' .. tostring(inflight['op']) .. (inflight['operationId'] and (' ' .. tostring(inflight['operationId'])) or '') .. ')'
  end
  if state == 'cancelled' then
    -- Asked to cancel now: a request instead, and the step is due now to read what the gateway did (its
    -- claim counts afresh: a flow stopped for claims used up must still be able to read).
    fields['outcome'] = nil
    fields['cancel_requested'] = '1'
    fields['runs'] = cjson.null
    fields['attempt'] = '0'
    due = ARGV[7]
    move('ready', KEYS[6], '; but ' .. what .. ': cancel requested, the gateway is read first')
    if old_state == 'ready' then
      idx = KEYS[4]
    end
  elseif cancel_requested and ARGV[13] ~= '1' and (state == 'waiting' or state == 'retrying' or state == 'sleeping') then
    -- A cancel asked while this step ran (not one its run already read for): read for it now, not at
    -- the wait's deadline (days, for a pay-by-link the customer could pay meanwhile).
    fields['runs'] = cjson.null
    fields['attempt'] = '0'
    due = ARGV[7]
    move('ready', KEYS[6], '; but ' .. what .. ': cancel requested, the gateway is read first')
  elseif state == 'failed' then
    -- The end is owed, not taken: read the gateway first (the step's next run only reads).
    fields['ending'] = cjson.encode({state = 'failed', outcome = event_json(after('outcome')) or cjson.null,
      error = event_json(after('error')) or cjson.null, reason = log['what']})
    fields['outcome'] = cjson.null
    due = ARGV[7]
    move('retrying', KEYS[11], '; but ' .. what .. ': the gateway is read before the flow fails')
  end
elseif cancel_requested and (CLAIMABLE[state] or state == 'failed') then
  -- Money taken, by this step's answer or an earlier step's (``money_moved``): nothing undoes it.
  local taken = paid or (state ~= 'cancelled' and event_json(after('money_moved')))
  if taken and state ~= 'cancelled' then
    -- Asked to stop, but the gateway took money: the request is refused, the flow goes on to say so.
    fields['cancel_requested'] = cjson.null
    rewritten = true
    log['what'] = (log['what'] or '') .. ' (cancel refused: the gateway took payment ' .. tostring(taken['operationId']) .. ')'
  else
    -- Cancelled while a step ran: keep what the step did, then stop at this step boundary.
    due = ''
    move('cancelled', KEYS[7], ' (then cancelled as requested)')
  end
end

local outcome = fields['outcome']
if outcome == cjson.null or outcome == nil then
  outcome = stored['outcome']
end
local late = unaccounted_signal(KEYS[1], fields, state, outcome, TERMINAL[state] and field_names() or nil)
if not late and paid and (state == 'cancelled' or state == 'failed') then
  late = paid
end
local ended = state
if late then
  fields['error'] = late_payment_error(late, state)
  due = ''
  move('needs_attention', KEYS[8], '; but ' .. late_payment_what(late, 'would end ' .. state))
end
-- The one home of "a flow whose money moved never ends failed": ``money_moved`` (the payment, refund,
-- capture or charge an earlier completion recorded taken, written by workflows/engine/protocol.py) turns any
-- failure (an outage past its bound, attempts used up, a read that keeps failing) into needs_attention
-- saying so: only the gateway's word, read by a person's retry, ends such a flow.
local money_moved = not late and state == 'failed' and after('money_moved')
if money_moved then
  local ok, taken = pcall(cjson.decode, money_moved)
  taken = (ok and type(taken) == 'table') and taken or {}
  fields['error'] = cjson.encode({type = 'MoneyMoved', endedAs = 'failed', operation = taken, reason = log['what']})
  fields['outcome'] = cjson.null
  due = ''
  move('needs_attention', KEYS[8], '; but money moved: the gateway took ' .. tostring(taken['operationId']) ..
    ' (' .. tostring(taken['operationResult']) .. '), so the flow does not end failed')
end
if state ~= old_state and not may_move(old_state, state) then
  return redis.error_reply('flow ' .. ARGV[1] .. ': cannot go from ' .. tostring(old_state) .. ' to ' .. state)
end
-- The change's fields in one HSET and one HDEL (a field is either written or deleted, so their order
-- does not matter); the state, version and due are written with what the end of the script adds.
local written, deleted = {}, {}
for name, value in pairs(fields) do
  if value == cjson.null then
    table.insert(deleted, name)
  else
    table.insert(written, name)
    table.insert(written, value)
  end
end
if #deleted > 0 then
  redis.call('HDEL', KEYS[1], unpack(deleted))
end
if #written > 0 then
  redis.call('HSET', KEYS[1], unpack(written))
end
written, deleted = {}, {}
if paid and state == 'needs_attention' then
  -- A payment this step found but could not take (on an order the flow left: LatePayment) is kept like a
  -- notification of it, so that no later move (a cancel, a retry that ends otherwise) can hide it.
  keep_signal(KEYS[1], cjson.encode({name = 'notification', payload = {operation = paid}, paid = paid,
    t = tonumber(ARGV[7])}), true)
end
if TERMINAL[state] then
  table.insert(deleted, 'cancel_requested')  -- used up: a later retry does not cancel again
elseif state == 'needs_attention' and after('cancel_requested') == '1' then
  -- Stopped for a person before the cancel could be judged (its read could not tell, a bound reached):
  -- the request is the person's now, said in the history. Kept, it would answer a second cancel
  -- "requested" on a flow no step runs, and a retry would silently drop the merchant's stop.
  table.insert(deleted, 'cancel_requested')
  log['what'] = (log['what'] or '') .. ' (the cancel requested is left to a person: cancel again or retry)'
  rewritten = true
end
local version = tonumber(current) + 1
table.insert(written, 'state')
table.insert(written, state)
table.insert(written, 'version')
table.insert(written, version)
table.insert(written, 'updated')
table.insert(written, ARGV[7])
if due == '' then
  table.insert(deleted, 'due')
  redis.call('ZREM', KEYS[3], ARGV[1])
else
  table.insert(written, 'due')
  table.insert(written, due)
  redis.call('ZADD', KEYS[3], due, ARGV[1])
end
if KEYS[4] ~= idx then
  redis.call('ZREM', KEYS[4], ARGV[1])
end
redis.call('ZADD', idx, ARGV[7], ARGV[1])
redis.call('RPUSH', KEYS[2], rewritten and cjson.encode(log) or ARGV[6])
if TERMINAL[state] then
  -- The one home of "a flow ends, but a change told while its step ran lets the customer pay on": a
  -- signal stored and not read by this step that carries ``keep_until`` (a link renewed through durapay,
  -- Engine.tell_holder: the renewal's own read of the link) keeps the finished flow that long, as a holder
  -- told once finished is kept (keep_until.lua); the packing pass gives record and lookups that end, so a
  -- payment on the renewed link is still verified and shows as a late payment.
  local keep = tonumber(after('keep_until') or '0') or 0
  local told = keep
  for _, key in ipairs(field_names()) do  -- (the signals this change did not delete)
    if string.sub(key, 1, 4) == 'sig:' and fields[key] ~= cjson.null then
      local ends = tonumber(cjson.decode(redis.call('HGET', KEYS[1], key))['keep_until'] or 0) or 0
      if ends > told then told = ends end
    end
  end
  if told > keep then
    table.insert(written, 'keep_until')
    table.insert(written, string.format('%.3f', told))
  end
  if ARGV[9] ~= '' then
    table.insert(written, 'input')
    table.insert(written, ARGV[9])
  end
  redis.call('ZADD', KEYS[10], ARGV[7], ARGV[1])
end
if #deleted > 0 then
  redis.call('HDEL', KEYS[1], unpack(deleted))
end
redis.call('HSET', KEYS[1], unpack(written))
for i = 12, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1])
end
-- No end here, finished or not: a finished flow gets its end from the packing pass, with its lookups
-- (workflows/engine/compact.py), so that a record never expires before its lookups have one.
-- (A log has an end only while its record has one: expand.lua and keep_until.lua give it the record's.)
if redis.call('PERSIST', KEYS[1]) == 1 then
  redis.call('PERSIST', KEYS[2])
end
if ARGV[10] == '1' then
  if late then
    emit(KEYS[9], KEYS[1], ARGV[1], 'payment.late', ARGV[7], {operation = late, endedAs = ended},
      {after('kind'), after('order_id'), after('outcome'), after('error'), after('terminal')})
  end
  -- What the events name, from the fields written and those read before (no read back).
  local kind, data = state_event(KEYS[1], state, log['what'], {after('outcome'), after('error'), after('step')})
  if kind then
    emit(KEYS[9], KEYS[1], ARGV[1], kind, ARGV[7], data, {after('kind'), after('order_id'), after('outcome'), after('error'), after('terminal')})
  elseif state == 'waiting' and not was_waiting then
    local wait = event_json(fields['wait']) or {}
    emit(KEYS[9], KEYS[1], ARGV[1], 'flow.waiting', ARGV[7], {customerUrl = after('customer_url') or cjson.null,
      deadline = wait['deadline'] or cjson.null, signals = wait['signals'] or cjson.null, step = wait['step'] or cjson.null},
      {after('kind'), after('order_id'), after('outcome'), after('error'), after('terminal')})
  end
end
return {version, state, rewritten and 1 or 0}
