-- Take a gateway target (a payment's order, a reservation) for a flow's money call: at most one flow
-- holds it at a time (workflows/engine/targets.py, the rule).
-- KEYS: 1 the target (hash: flow, token, t), 2 its waiters (sorted set of flow ids, by when they first
--       waited).
-- ARGV: 1 flow id, 2 the token of the flow's hold, 3 the token of a holder the caller found no longer
--       holding ('' for none: the caller takes only a free target, or one already its own), 4 now.
-- Returns {'ok'}: the target is this hold's now; or {'held', holder flow, holder token}: the caller is
-- listed among the waiters, woken when the target is let go (target_free.lua).
-- Resend-safe (workflows/engine/scripts.py): a second run of a take that succeeded finds its own token and
-- answers ok; of one that did not, lists the waiter again.
local held = redis.call('HMGET', KEYS[1], 'flow', 'token')
local token = held[2]
if not token or token == ARGV[2] or (ARGV[3] ~= '' and token == ARGV[3]) then
  redis.call('HSET', KEYS[1], 'flow', ARGV[1], 'token', ARGV[2], 't', ARGV[4])
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {'ok'}
end
redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[1])
return {'held', held[1] or '', token}
