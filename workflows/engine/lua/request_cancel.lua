-- Ask a running step's flow to stop at its step boundary: the step completes, and its completion (or, if
-- money may be in flight, the read that settles it) ends the flow (transition.lua).
-- KEYS: flow. ARGV: 1 the version the caller read the flow at.
-- Returns 1 when asked; 0 when the flow is no longer running at that version (its step completed
-- meanwhile, or the record is gone): the caller reads it again. Nothing is written then, so a record
-- that expired is never brought back as a hash without its fields.
local data = redis.call('HMGET', KEYS[1], 'version', 'state')
if data[1] ~= ARGV[1] or data[2] ~= 'running' then
  return 0
end
redis.call('HSET', KEYS[1], 'cancel_requested', '1')
return 1
