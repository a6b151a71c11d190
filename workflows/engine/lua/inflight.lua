-- Money in flight as the engine's scripts read it: the Lua side of workflows/engine/inflight.py, which writes
-- the record's ``unsettled`` (JSON {step, op, t, operationId?, open?}); prepended to the scripts that
-- judge it, so that none of them reads the field its own way.
-- in_flight(raw): money may be moving at the gateway for the flow (a money call sent and not settled by
--   the gateway's word, or something a customer can pay on): the flow ends neither cancelled nor failed
--   before a read of the gateway (transition.lua), and a claim does not mark it again (claim.lua).
-- unanswered(raw, step): the money call of ``step`` may have been sent and the gateway has named no
--   operation for it yet: a read-back of its target could not tell its operation from another's, so the
--   flow keeps its gateway target (target_flow.lua). An unreadable mark counts as unanswered: a target is
--   never let go on a doubt.
local function in_flight(raw)
  return raw ~= nil and raw ~= false and raw ~= ''
end

local function unanswered(raw, step)
  if not in_flight(raw) then
    return false
  end
  local ok, mark = pcall(cjson.decode, raw)
  if not ok or type(mark) ~= 'table' then
    return true
  end
  return mark['step'] == step and not mark['operationId'] and not mark['open']
end
