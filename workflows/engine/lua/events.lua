-- Shared by create.lua, transition.lua and signal.lua (FlowStore prepends this file): merchant events
-- written in the same script as the change that causes them (an outbox in the flow's own slot), so an
-- event exists if and only if its transition happened.
--
-- Each event is one entry of the partition's stream (KEYS: the stream, in the flow's hash slot), field
-- "e" = JSON {type, time, flow, kind, orderId, operationId, [terminal,] data}; its id is the stream entry's
-- id. terminal is the flow's gateway terminal, written only when it is not default (workflows/engine/terminals.py).
-- The data object is built here from what the record holds after the change, and carries no card data
-- (outcomes and errors never hold any; the card lives only in the input).

local function event_json(value)
  if value == nil or value == false or value == '' then
    return nil
  end
  local ok, decoded = pcall(cjson.decode, value)
  if ok and type(decoded) == 'table' then
    return decoded
  end
  return nil
end

-- Emit event ``kind`` of the flow at ``flow_key`` (after its change) on ``stream``. ``known``: the
-- record's kind, order_id, outcome, error and terminal when the caller has just written them (create.lua),
-- as HMGET would answer them (false for an absent field); read from the record otherwise.
local function emit(stream, flow_key, flow_id, kind, now, data, known)
  local fields = known or redis.call('HMGET', flow_key, 'kind', 'order_id', 'outcome', 'error', 'terminal')
  local outcome = event_json(fields[3]) or {}
  local operation = outcome['operation'] or {}
  local err = event_json(fields[4]) or {}
  local operation_id = operation['operationId'] or err['operationId']
  if type(data['operation']) == 'table' and data['operation']['operationId'] then
    operation_id = data['operation']['operationId']
  end
  -- A flow that makes no order of its own (a refund, a capture, a reservation charge) acts on the order
  -- of the operation it reports: name that one, so that a payment's refunds are found from its order.
  local order_id = fields[2]
  if not order_id or order_id == '' then
    order_id = operation['orderId']
    if type(data['operation']) == 'table' and data['operation']['orderId'] then
      order_id = data['operation']['orderId']
    end
  end
  local event = {
    type = kind,
    time = tonumber(now),
    flow = flow_id,
    kind = fields[1],
    orderId = order_id or cjson.null,
    operationId = operation_id or cjson.null,
    terminal = fields[5] or nil,
    data = data,
  }
  redis.call('XADD', stream, '*', 'e', cjson.encode(event))
end

-- The states that have an event of their own (state_event): a move to another state reads nothing for one.
local STATE_EVENTS = {succeeded = true, failed = true, cancelled = true, needs_attention = true}

-- The data of the event for a flow that just reached ``state`` (nil: no event for that state).
-- ``known``: the record's outcome, error and step after the change when the caller has them (as HMGET
-- would answer them: false for an absent field), read from the record otherwise.
local function state_event(flow_key, state, what, known)
  if not STATE_EVENTS[state] then
    return nil, nil
  end
  local fields = known or redis.call('HMGET', flow_key, 'outcome', 'error', 'step')
  local outcome = event_json(fields[1]) or {}
  local err = event_json(fields[2])
  if state == 'succeeded' then
    return 'flow.succeeded', {operation = outcome['operation'] or cjson.null, step = fields[3]}
  elseif state == 'failed' then
    local decline = err and err['decline'] or cjson.null
    return 'flow.failed', {reason = outcome['reason'] or what, error = err or cjson.null, decline = decline,
      operation = outcome['operation'] or cjson.null, step = fields[3]}
  elseif state == 'cancelled' then
    return 'flow.cancelled', {reason = outcome['reason'] or what, step = fields[3]}
  elseif state == 'needs_attention' then
    return 'flow.needs_attention', {reason = what, error = err or cjson.null, step = fields[3]}
  end
  return nil, nil
end
