-- Create a flow unless it exists (events.lua is prepended). KEYS: flow, log, due, state index, kind
-- index, event stream, and on a single server the flow's order lookup (absent on a cluster, where it
-- sits in the order id's slot).
-- ARGV: flow id, now, log entry (JSON), due time, "1" to emit flow.created, then the record's fields
-- as name, value pairs (state, step, kind and order_id among them, input_hash too), written in one HSET.
-- Returns {1, "", pointed} when created, {0, <stored input hash>, 0} when the flow already existed,
-- {2, <holder>, 0} when the order lookup names another flow: nothing is written (a gateway order id is
-- one flow's as long as its lookup lives, that is until the retention after that flow ended: a payment
-- on it is that flow's, and a second flow naming it could only be refused by the gateway, or take that
-- flow's money for its own). pointed is 1 when the order lookup was free and now names the new flow
-- (OrderIndex.claim's move, made here to save the start a round trip); 0 leaves it to OrderIndex.claim.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('HGET', KEYS[1], 'input_hash') or '', 0}
end
if KEYS[7] then
  local holder = redis.call('HGET', KEYS[7], 'flow')
  if holder and holder ~= ARGV[1] then
    return {2, holder, 0}
  end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
local fields = {}
for i = 6, #ARGV, 2 do
  fields[ARGV[i]] = ARGV[i + 1]
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[2], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[3])
if ARGV[5] == '1' then
  local run_at = cjson.null
  if fields['state'] == 'sleeping' then
    run_at = tonumber(ARGV[4])
  end
  -- The record's kind and order id are the ones just written: no read back.
  emit(KEYS[6], KEYS[1], ARGV[1], 'flow.created', ARGV[2], {state = fields['state'], step = fields['step'], runAt = run_at},
    {fields['kind'], fields['order_id'] or false, false, false})
end
local pointed = 0
if KEYS[7] then
  pointed = redis.call('HSETNX', KEYS[7], 'flow', ARGV[1])
end
return {1, '', pointed}
