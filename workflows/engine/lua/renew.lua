-- Extend the lease of a claimed step before its next gateway call (a step may make several).
-- KEYS: flow, due. ARGV: 1 flow id, 2 the claim's version, 3 owner, 4 new lease end.
-- Returns 1 when the lease was extended, 0 when the claim is no longer this worker's (the step was
-- taken over, completed or cancelled): the worker must then make no further call.
local data = redis.call('HMGET', KEYS[1], 'state', 'version', 'lease_owner')
if data[1] ~= 'running' or data[2] ~= ARGV[2] or data[3] ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], 'lease_until', ARGV[4], 'due', ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
return 1
