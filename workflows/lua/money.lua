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
  if state == 'failed' or state == 'cancelled' then
    return true
  end
  if state ~= 'succeeded' then
    return false
  end
  -- Succeeded: accounted when its outcome names the operation (an outcome that lists no operation ids
  -- at all belongs to a flow kind that takes no payment of its own, and is not judged).
  local ok, outcome = pcall(cjson.decode, outcome_json or '')
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
local function unaccounted_signal(flow_key, fields, state, outcome_json)
  if state ~= 'succeeded' and state ~= 'failed' and state ~= 'cancelled' then
    return nil
  end
  for _, key in ipairs(redis.call('HKEYS', flow_key)) do
    if string.sub(key, 1, 4) == 'sig:' and fields[key] ~= cjson.null then
      local signal = cjson.decode(redis.call('HGET', flow_key, key))
      if unaccounted(signal['paid'], state, outcome_json) then
        return signal['paid']
      end
    end
  end
  return nil
end

local function late_payment_error(paid, ended)
  return cjson.encode({type = 'LatePayment', endedAs = ended, operation = paid})
end

local function late_payment_what(paid, ended)
  return 'late payment: the gateway reports ' .. tostring(paid['operationResult']) .. ' of operation ' ..
    tostring(paid['operationId']) .. ' while the flow ' .. ended
end
