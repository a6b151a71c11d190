-- A claim of a capped fairness key's step takes its flow's place (workflows.engine.fairness.Caps), or a renewal
-- of that claim's lease renews it: the place lapses with the lease, not a lease after the step was sent.
-- KEYS: the key's running set, its owners. ARGV: flow id, lapse time, the claim's token, 'claim' or
-- 'renew'. A claim takes the place whoever held it (the claim decides who runs the step: an older
-- claim's run is stale); a renewal renews only its own (0 when another claim holds it now).
if ARGV[4] == 'renew' then
  local holder = redis.call('HGET', KEYS[2], ARGV[1])
  if holder and holder ~= ARGV[3] then
    return 0
  end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
