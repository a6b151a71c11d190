-- Admit a flow's step under its fairness key's cap (workflows.engine.fairness.Caps), or hold it back.
-- KEYS: the key's running set (flow id -> when its place lapses), its held set (flow id -> when held),
-- its owners (flow id -> the claim holding its place). ARGV: flow id, now, lapse time, cap, most held,
-- since (when the flow began to wait: now, or for a flow the dispatcher sends from its due entry, a
-- hold earlier). Lapsed places (a worker lost, a sent step never claimed) are dropped first.
-- Returns 1 admitted (it is, or was already, among the running), 0 held (listed, oldest first, for the
-- next release), -1 held unlisted (the held set is full of flows waiting longer: its due entry brings it
-- back). A flow listed for less long than `since` gives its slot up (it stays due, unlisted): a flow
-- beyond the list thus waits at most one hold and the list ahead of it. A held flow stays on the due
-- set either way: it is never only here.
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
for i = 1, #lapsed do
  redis.call('ZREM', KEYS[1], lapsed[i])
  redis.call('HDEL', KEYS[3], lapsed[i])
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 1
end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])  -- a new place: no claim holds it yet
  return 1
end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
if redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[5]) then
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[1])
  return 0
end
local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if newest[2] and tonumber(newest[2]) > tonumber(ARGV[6]) then
  redis.call('ZREM', KEYS[2], newest[1])
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[1])
  return 0
end
return -1
