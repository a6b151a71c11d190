-- A bulk action's runner (workflows/bulk.py) renews its lease and moves the action on by one flow, only
-- while the lease is still its own and the action stands where the runner read it: a runner that lost its
-- lease (stalled past it: a Redis failover waited out, a slow flow) and was replaced stops, instead of
-- acting on and counting with a position of its own.
-- KEYS: 1 the runner's lease, 2 the action's record (hash)
-- ARGV: 1 what: renew | advance, 2 the runner's token, 3 the position it stands at, 4 the lease (ms),
--       advance: 5 the counter to add one to (done | skipped), 6 the time (updated), 7 the total,
--                8 skips (JSON; "" unchanged), 9 the skipped sample (JSON),
--                10 a second counter to add one to ("" none; changed: skipped as changed since the dry run)
-- Replies 1, or 0: the lease is another runner's or gone, or the position moved (the runner stops).
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
if redis.call('HGET', KEYS[2], 'position') ~= ARGV[3] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if ARGV[1] == 'advance' then
  local position = tonumber(ARGV[3]) + 1
  redis.call('HSET', KEYS[2], 'position', tostring(position), 'updated', ARGV[6])
  redis.call('HINCRBY', KEYS[2], ARGV[5], 1)
  if ARGV[10] ~= '' then
    redis.call('HINCRBY', KEYS[2], ARGV[10], 1)
  end
  if ARGV[8] ~= '' then
    redis.call('HSET', KEYS[2], 'skips', ARGV[8], 'skipped_sample', ARGV[9])
  end
  if position >= tonumber(ARGV[7]) then
    redis.call('HSET', KEYS[2], 'status', 'done')
  end
end
return 1
