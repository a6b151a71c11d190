-- Shared by signal.lua and transition.lua (FlowStore prepends this file to both): the one rule that
-- money the gateway reported shows in the flow.
--
-- A kept signal carries "paid" (the operation's id, order, result, amount) when it reports a payment
-- taken: the engine marks it when it stores it. Such a payment is *unaccounted* when the flow is (or is
-- about to be) failed or cancelled, or succeeded with an outcome that does not name that operation
-- (a second payment). The flow then goes to needs_attention with error LatePayment naming it: never a
-- silent end with money at the gateway.

-- Whether the payment ``paid`` is unaccounted in a flow in ``state`` whose outcome is ``outcome_json``.
local function unaccounted(paid, state, outcome_json)
  if type(paid) ~= 'table' then
    return false
  end
  if state ~= 'succeeded' and state ~= 'failed' and state ~= 'cancelled' then
    return false
  end
  local ok, outcome = pcall(cjson.decode, outcome_json or '')
  if ok and type(outcome) == 'table' and type(outcome['latePayments']) == 'table' then
    for _, closed in ipairs(outcome['latePayments']) do
      if type(closed) == 'table' and tostring(closed['operationId']) == tostring(paid['operationId']) then
        return false  -- a person closed it (refunded or kept: workflows/late_payments.py): no news again
      end
    end
  end
  if state == 'failed' or state == 'cancelled' then
    return true
  end
  -- Succeeded: accounted when its outcome names the operation (an outcome that lists no operation ids
  -- at all belongs to a flow kind that takes no payment of its own, and is not judged).
  if not ok or type(outcome) ~= 'table' or type(outcome['operationIds']) ~= 'table' then
    return false
  end
  for _, id in ipairs(outcome['operationIds']) do
    if tostring(id) == tostring(paid['operationId']) then
      return false
    end
  end
  return true
end

-- The first kept signal of ``flow_key`` (not deleted by ``fields``) whose payment is unaccounted.
-- ``names``: the record's field names when the caller has read them (HKEYS), read here otherwise.
local function unaccounted_signal(flow_key, fields, state, outcome_json, names)
  if state ~= 'succeeded' and state ~= 'failed' and state ~= 'cancelled' then
    return nil
  end
  for _, key in ipairs(names or redis.call('HKEYS', flow_key)) do
    if string.sub(key, 1, 4) == 'sig:' and fields[key] ~= cjson.null then
      local signal = cjson.decode(redis.call('HGET', flow_key, key))
      if unaccounted(signal['paid'], state, outcome_json) then
        return signal['paid']
      end
    end
  end
  return nil
end

-- Keep ``signal`` (JSON text of {name, payload, t, paid?}) on the flow as its next signal (sig:<n>): the
-- one way a reported payment is kept until a person or the flow's outcome accounts for it. With
-- ``unless_kept``, nothing is written when a kept signal already reports the same operation.
local function keep_signal(flow_key, signal, unless_kept)
  if unless_kept then
    local id = tostring((cjson.decode(signal)['paid'] or {})['operationId'])
    for _, key in ipairs(redis.call('HKEYS', flow_key)) do
      if string.sub(key, 1, 4) == 'sig:' then
        local kept = cjson.decode(redis.call('HGET', flow_key, key))
        if type(kept['paid']) == 'table' and tostring(kept['paid']['operationId']) == id then
          return
        end
      end
    end
  end
  local seq = redis.call('HINCRBY', flow_key, 'sigseq', 1)
  redis.call('HSET', flow_key, 'sig:' .. seq, signal)
end

local function late_payment_error(paid, ended)
  return cjson.encode({type = 'LatePayment', endedAs = ended, operation = paid})
end

local function late_payment_what(paid, ended)
  return 'late payment: the gateway reports ' .. tostring(paid['operationResult']) .. ' of operation ' ..
    tostring(paid['operationId']) .. ' while the flow ' .. ended
end
