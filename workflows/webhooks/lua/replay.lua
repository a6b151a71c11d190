-- Schedule deliveries again (``durapay events replay``): each member due now, its attempts counted afresh.
-- KEYS: 1 the due set, 2 the state hash. ARGV: now, then the members.
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], ARGV[1], ARGV[i])
  redis.call('HSET', KEYS[2], ARGV[i], cjson.encode({f = tonumber(ARGV[1]), n = 0, r = 1}))
end
return #ARGV - 1
