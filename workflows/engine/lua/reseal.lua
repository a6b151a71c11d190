-- A flow's input sealed again under the first card key (workflows/engine/cards.py, reseal_in_flight): written
-- only while the input is still the one read (a flow that ended meanwhile has its scrubbed input, which
-- stays). KEYS: flow. ARGV: the input read, the input sealed again. Returns 1 when written, 0 otherwise.
if redis.call('HGET', KEYS[1], 'input') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'input', ARGV[2])
return 1
