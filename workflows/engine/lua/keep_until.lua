-- Keep a finished flow until a later moment: another flow renewed the link of an order it made, and its
-- customer may still pay on it (Engine.tell_holder). states.lua is prepended.
-- KEYS: flow, log. ARGV: 1 until (POSIX seconds), 2 milliseconds from now to then.
-- Returns the record's time to live in milliseconds once kept (0: the record has no end, is gone, or is
-- no longer finished: a flow going again is told by a signal, and left alone).
--
-- ``keep_until`` is written to the record (never lowered): the packing pass gives a finished record and
-- its lookups their end from it (workflows/engine/compact.py). The version moves, so that a pass that read the
-- record before packs nothing (it reads again). A record that has its end already (packed by an earlier
-- pass) is kept until then now; the caller gives its lookups as long.
if not TERMINAL[redis.call('HGET', KEYS[1], 'state')] then
  return 0
end
local kept = tonumber(redis.call('HGET', KEYS[1], 'keep_until') or '0') or 0
if tonumber(ARGV[1]) > kept then
  redis.call('HSET', KEYS[1], 'keep_until', ARGV[1])
end
redis.call('HINCRBY', KEYS[1], 'version', 1)
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  return 0
end
ttl = math.max(ttl, tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ttl)
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return ttl
