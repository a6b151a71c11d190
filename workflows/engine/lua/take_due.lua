-- Take the flows due by now from one partition's due set, pushing each back by a grace period so
-- that no other dispatcher takes it meanwhile (if the send is lost, it comes due again).
-- KEYS: due. ARGV: now, batch size, grace seconds. Returns the flow ids taken.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local later = tonumber(ARGV[1]) + tonumber(ARGV[3])
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], 'XX', later, id)
end
return ids
