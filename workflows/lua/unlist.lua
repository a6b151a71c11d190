-- The packing pass takes a packed flow off its partition's finished set once the flow's lookups (its
-- orders, their tokens, the operations it recorded: workflows/orders.py, in other slots) have their end:
-- never before, so that no pass cut half-way leaves a lookup with no end (workflows/compact.py).
-- KEYS: flow, the partition's finished set. ARGV: 1 flow id, 2 the version the record was packed at.
-- Returns 1 when unlisted (also when the record is gone), 0 when it is no longer packed at that version
-- (a late payment or a retry unpacked it, expand.lua, which listed it again: it stays listed).
local version = redis.call('HGET', KEYS[1], 'version')
if version and (version ~= ARGV[2] or redis.call('HEXISTS', KEYS[1], 'z') == 0) then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
