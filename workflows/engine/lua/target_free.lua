-- Let a gateway target go once its holder's money call there is resolved (workflows/engine/targets.py), and
-- name the flows waiting for it, oldest first, to be woken (at most ARGV[2]: the rest are woken by the
-- next holder's release, or by their own bounded polls).
-- KEYS: 1 the target, 2 its waiters. ARGV: 1 the holder's token, 2 how many waiters to name.
-- Returns the waiters' flow ids; {} when the target is not this token's any more (taken over: its new
-- holder wakes them).
-- Not resend-safe: a second run finds the target gone and names no one (the waiters' polls take them up).
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return {}
end
redis.call('DEL', KEYS[1])
local woken = {}
local popped = redis.call('ZPOPMIN', KEYS[2], tonumber(ARGV[2]))
for i = 1, #popped, 2 do
  table.insert(woken, popped[i])
end
return woken
