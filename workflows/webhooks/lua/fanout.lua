-- Fan the new events of one stream out to the endpoints that want them, and move the stream's
-- fan-out cursor past them, in one atomic step: an event is either still ahead of the cursor or has a
-- delivery on the due set for each subscribed endpoint, never neither (so never lost, whatever dies).
-- KEYS: 1 the event stream, 2 its fan-out cursor (the last entry id fanned out), 3 the deliveries'
--       due set, 4 the deliveries' state hash (member -> JSON {f: first due, n: attempts made}).
-- ARGV: 1 endpoints (JSON list of {id, types, after}: after = the first ms whose entries are the endpoint's,
--       the one following its creation's: see endpoints.py),
--       2 now (the due score of new deliveries), 3 max entries, 4 read_at: ms at which the endpoints
--       were read (entries from then on wait for the next pass: an endpoint made meanwhile may want them).
-- Returns {entries passed, deliveries added}.
local endpoints = cjson.decode(ARGV[1])
local read_at = tonumber(ARGV[4])
local last = redis.call('GET', KEYS[2])
if #endpoints == 0 then
  -- Nobody listens: jump to the last entry before read_at (an endpoint made later wants none of them).
  local top = redis.call('XREVRANGE', KEYS[1], '(' .. read_at .. '-0', '-', 'COUNT', 1)
  if top[1] and (not last or top[1][1] ~= last) then
    redis.call('SET', KEYS[2], top[1][1])
  end
  return {0, 0}
end
local start = '-'
if last then start = '(' .. last end
local entries = redis.call('XRANGE', KEYS[1], start, '(' .. read_at .. '-0', 'COUNT', tonumber(ARGV[3]))
local added = 0
for _, entry in ipairs(entries) do
  local id = entry[1]
  local ms = tonumber(string.match(id, '^(%d+)'))
  local event_type = ''
  local values = entry[2]
  for i = 1, #values, 2 do
    if values[i] == 'e' then
      local ok, decoded = pcall(cjson.decode, values[i + 1])
      if ok and type(decoded) == 'table' and type(decoded['type']) == 'string' then
        event_type = decoded['type']
      end
    end
  end
  for _, endpoint in ipairs(endpoints) do
    local wanted = ms >= tonumber(endpoint['after'])
    if wanted and #endpoint['types'] > 0 then
      wanted = false
      for _, name in ipairs(endpoint['types']) do
        if name == event_type then wanted = true end
      end
    end
    if wanted then
      local member = id .. '|' .. endpoint['id']
      if redis.call('ZADD', KEYS[3], 'NX', ARGV[2], member) == 1 then
        redis.call('HSET', KEYS[4], member, cjson.encode({f = tonumber(ARGV[2]), n = 0}))
        added = added + 1
      end
    end
  end
end
if #entries > 0 then
  redis.call('SET', KEYS[2], entries[#entries][1])
end
return {#entries, added}
