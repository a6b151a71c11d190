-- The packing pass takes a packed flow off its partition's finished set once the flow's lookups (its
-- orders, their tokens, the operations it recorded: workflows/engine/orders.py, in other slots) have their end:
-- never before, so that no pass cut half-way leaves a lookup with no end (workflows/engine/compact.py).
-- KEYS: flow, the partition's finished set. ARGV: 1 flow id, 2 the version the record was packed at.
-- Returns {1, state} when unlisted (also when the record is gone: state false), {0, state} when it is no
-- longer packed at that version (a late payment or a retry unpacked it, expand.lua, which listed it
-- again: it stays listed). The state, read after its lookups got their end, tells the pass whether the
-- flow is going again (Compactor._keep_returned).
local data = redis.call('HMGET', KEYS[1], 'version', 'z', 'state')
local version = data[1]
if version and (version ~= ARGV[2] or not data[2]) then
  return {0, data[3]}
end
redis.call('ZREM', KEYS[2], ARGV[1])
return {1, data[3]}
