-- A flow's side of a gateway target (workflows/engine/targets.py; inflight.lua is prepended). The flow's record
-- is the truth of whether it holds one: ``hold`` (JSON {target, token, step, t, before?}) names the target
-- its money step holds, written before the target's key can name the flow; the flow holds it for as long
-- as that step's money call is unanswered (inflight.lua). ``hold_fence`` is a token another flow took the
-- target over from: no hold under it is written again.
-- KEYS: 1 the flow, 2 its partition's due set (wake only).
-- ARGV[1], the mode:
-- * 'check' (ARGV 2 target, 3 token, 4 '1' to fence): {'held', state, step, kind} while the flow holds
--   ``target`` under ``token`` (a token fenced is no longer held: another flow took the target over from
--   it); else {'free'}, and with a fence, a running claim of the flow can no longer
--   record a hold under ``token`` (it had not yet: the caller takes the target over, and that claim must
--   not send).
-- * 'intent' / 'snapshot' (ARGV 2 the claim's version, 3 its lease owner, 4 the hold, JSON): record the
--   hold of the flow's running claim ({'ok'}), refused ({'lost'}) when the claim is no longer that one or
--   the token was fenced; a snapshot only over the intent of the same token.
-- * 'wake' (ARGV 2 target, 3 now, 4 flow id): a flow waiting in ``retrying`` for ``target`` (its error
--   ``TargetHeld``) is due now: 1, else 0.
-- Resend-safe (workflows/engine/scripts.py): each mode writes the same again and answers as it did.
local mode = ARGV[1]
if mode == 'check' then
  local raw = redis.call('HMGET', KEYS[1], 'hold', 'unsettled', 'state', 'step', 'kind', 'hold_fence')
  if raw[1] and raw[6] ~= ARGV[3] then
    local ok, hold = pcall(cjson.decode, raw[1])
    if ok and type(hold) == 'table' and hold['target'] == ARGV[2] and hold['token'] == ARGV[3]
      and unanswered(raw[2], hold['step']) then
      return {'held', raw[3] or '', raw[4] or '', raw[5] or ''}
    end
  end
  if ARGV[4] == '1' and raw[3] == 'running' then
    redis.call('HSET', KEYS[1], 'hold_fence', ARGV[3])
  end
  return {'free'}
end
if mode == 'wake' then
  local data = redis.call('HMGET', KEYS[1], 'state', 'error')
  if data[1] ~= 'retrying' or not data[2] then
    return 0
  end
  local ok, err = pcall(cjson.decode, data[2])
  if not ok or type(err) ~= 'table' or err['type'] ~= 'TargetHeld' or err['target'] ~= ARGV[2] then
    return 0
  end
  redis.call('HSET', KEYS[1], 'due', ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
  return 1
end
local data = redis.call('HMGET', KEYS[1], 'version', 'lease_owner', 'state', 'hold_fence', 'hold')
if data[1] ~= ARGV[2] or data[2] ~= ARGV[3] or data[3] ~= 'running' then
  return {'lost'}
end
local hold = cjson.decode(ARGV[4])
if data[4] == hold['token'] then
  return {'lost'}
end
if mode == 'snapshot' then
  local ok, current = pcall(cjson.decode, data[5] or '')
  if not ok or type(current) ~= 'table' or current['token'] ~= hold['token'] then
    return {'lost'}
  end
end
redis.call('HSET', KEYS[1], 'hold', ARGV[4])
return {'ok'}
