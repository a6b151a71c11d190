-- Keep a merchant step's output before its completion is written (workflows.engine.steps.MerchantStep): a
-- worker that dies after the merchant's function returned leaves the output here, and the step's next
-- try records it instead of calling the function again.
-- KEYS: flow. ARGV: 1 the claim's version, 2 owner, 3 field, 4 output (JSON).
-- Returns the output kept under the field (the first one kept wins), or false when the claim is no
-- longer this worker's (taken over, completed or cancelled): nothing is written then.
local data = redis.call('HMGET', KEYS[1], 'state', 'version', 'lease_owner')
if data[1] ~= 'running' or data[2] ~= ARGV[1] or data[3] ~= ARGV[2] then
  return false
end
redis.call('HSETNX', KEYS[1], ARGV[3], ARGV[4])
return redis.call('HGET', KEYS[1], ARGV[3])
