-- A person's decision recorded on a flow, its state left as it is: a late payment's refund asked
-- (LatePayments.refund), before the refund flow is started. The version moves, so that a decision made
-- on the record as it was before (a keep or an accept of that payment, read while the refund was asked)
-- finds it changed and is refused: two people's decisions on one payment are serialised by the flow's
-- version, whatever other keys each one writes.
-- KEYS: flow. ARGV: 1 the version the caller read the flow at, 2 the field, 3 its value (JSON).
-- Returns 1 when written; 0 when the flow is no longer at that version (or gone): the caller reads again.
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('HINCRBY', KEYS[1], 'version', 1)
return 1
