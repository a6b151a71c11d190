-- The dispatcher met a due flow of a paused kind (pause.lua is prepended): hold it, or say it is free.
-- KEYS: flow, log, due, paused, held. ARGV: flow id, now, re-check seconds.
-- Returns 'held', 'free' (send it), or 'gone' (no record, or stopped: nothing to hold).
local data = redis.call('HMGET', KEYS[1], 'kind', 'state', 'step', 'due', 'held')
if not data[1] or STOPPED[data[2]] then
  return 'gone'
end
if hold_if_paused(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], data[1], data[2], data[3], data[4], data[5],
    ARGV[2], ARGV[3]) then
  return 'held'
end
return 'free'
