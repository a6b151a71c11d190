-- A resume releases a flow its kind's pause held (pause.lua is prepended): the resume logged once, the
-- flow off the held set and due again now (or at its own time, a timer or a backoff still ahead).
-- KEYS: flow, log, due, paused, held. ARGV: flow id, kind, now, who resumed.
-- Returns 'released', 'paused' (its kind is paused again: the new pause holds it), or 'gone'.
local data = redis.call('HMGET', KEYS[1], 'kind', 'state', 'step', 'due', 'held')
if not data[1] then
  redis.call('ZREM', KEYS[5], ARGV[2] .. '\31' .. ARGV[1])
  return 'gone'
end
if not data[5] or STOPPED[data[2]] then  -- released already, or ended meanwhile (an operator's cancel)
  redis.call('HDEL', KEYS[1], 'held')
  redis.call('ZREM', KEYS[5], ARGV[2] .. '\31' .. ARGV[1])
  return 'gone'
end
if not release_if_resumed(KEYS[1], KEYS[2], KEYS[5], KEYS[4], ARGV[1], data[1], data[2], data[3], data[5], ARGV[3], ARGV[4]) then
  return 'paused'
end
if CLAIMABLE[data[2]] then
  local when = tonumber(ARGV[3])
  local own = tonumber(data[4] or '')
  if own and own > when and data[2] ~= 'ready' then
    when = own
  end
  redis.call('ZADD', KEYS[3], 'XX', when, ARGV[1])
end
return 'released'
