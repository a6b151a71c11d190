-- Claim a flow's step under a lease in one round trip: every claim rule lives here (states.lua is
-- prepended: the states and their moves; inflight.lua: money in flight as the scripts read it).
-- KEYS: flow, log, due, then the state indexes ready, retrying, waiting, sleeping, running, then the
--       partition's paused kinds and held flows (pause.lua, prepended: a paused kind's step is not claimed),
--       then the parked index.
-- ARGV: 1 flow id, 2 step, 3 now, 4 lease until, 5 owner, 6 max attempts, 7 max runs of one step,
--       8 the gateway operations that a step of this name calls when it moves money or opens what a
--         customer pays on (workflows/inflight.money_operation), by definition ("kind@version": the
--         version's own step; a version migrating onto a newer one, the newer one's) and by kind (for a
--         record whose definition is not known here), and the format of this release's marks (JSON
--         {ops: {key: operation}, v: workflows/inflight.MARK_FORMAT}; "" when no step of this name has one),
--       9 the pause's re-check seconds,
--       10 the definitions the claiming process holds (" kind@version kind@version ... ", spaces around
--          each; workflows/engine/versions.py) and the "kind@version" a record with no definition field started
--          on, the same way (" kind=kind@version ... "); "" to claim whatever the record names,
--       11 the seconds after which a parked flow is offered again (to any process: one holding it runs it).
-- Resend-safe (workflows/engine/scripts.py): a second run of a claim that ran answers ok with the record.
-- Returns {reason} when the step is not claimed: missing, not-current, leased, stopped, early, paused,
-- parked (the flow's definition is not one this process holds: the flow waits in ``parked``, its
-- attempts untouched, and is offered again after ARGV 11 seconds);
-- {'ok', previous state, field, value, ...} with the record as written by the claim; or, writing only
-- the lost lease's end as the moment a call may last have been sent, {'lost', state, field, value, ...} for a step whose worker was lost max-attempts
-- times, and {'looping', ...} for a step claimed max-runs times without moving on (the backstop under
-- every loop: polls, waits woken again and again, retries that reset): the caller ends the flow with a
-- compare-and-set (transition.lua), which also scrubs the card data.
-- Money in flight: the claim of a step that moves money (or opens a page, link or form) records it as ``unsettled`` (JSON {step, op, t, v})
-- before any call can be made, unless the flow is only to read what an earlier try did (a cancel
-- requested, or an end owed once the gateway is read: ``ending``); only a gateway read, written by the
-- step's completion, settles it, and transition.lua lets no flow end cancelled or failed before.
-- A cancel requested is no longer decided here: the step is claimed and only reads (protocol.py).
-- A step found 'early' or 'leased' has its due entry re-armed at the record's own time: a dispatcher
-- that took it pushed it back by a lease, which a worker whose clock is behind must not leave there.
local data = redis.call('HMGET', KEYS[1], 'state', 'step', 'lease_until', 'due', 'attempt', 'cancel_requested', 'version', 'runs',
  'ending', 'unsettled', 'kind', 'held', 'definition')
if not data[1] and redis.call('EXISTS', KEYS[1]) == 0 then  -- (every record has its state: asked only without one)
  return {'missing'}
end
local state, step, lease_until, due = data[1], data[2] or '', data[3], data[4]
local attempt = tonumber(data[5] or '0') or 0
local now = tonumber(ARGV[3])
local indexes = {ready = KEYS[4], retrying = KEYS[5], waiting = KEYS[6], sleeping = KEYS[7], running = KEYS[8], parked = KEYS[11]}
local old_index = indexes[state]
if not CLAIMABLE[state] or not old_index then
  return {'stopped'}  -- (judged first: a packed finished flow keeps its state plain, not its step)
end
if step ~= ARGV[2] then
  return {'not-current'}
end
local reclaim = false
if state == 'running' then
  if lease_until == ARGV[4] and redis.call('HGET', KEYS[1], 'lease_owner') == ARGV[5] then
    -- This very claim, sent again after its answer was lost (a failover): the lease it wrote (its owner
    -- and lease end, a per-claim token) is recognised and answered as the first was, not 'leased'.
    local result = {'ok', state}
    for _, item in ipairs(redis.call('HGETALL', KEYS[1])) do
      table.insert(result, item)
    end
    return result
  end
  if lease_until and tonumber(lease_until) > now then
    redis.call('ZADD', KEYS[3], lease_until, ARGV[1])
    return {'leased'}
  end
  reclaim = true
elseif state ~= 'ready' and (not due or tonumber(due) > now) then
  if due then
    redis.call('ZADD', KEYS[3], due, ARGV[1])
  end
  return {'early'}
end
if hold_if_paused(KEYS[1], KEYS[2], KEYS[3], KEYS[9], KEYS[10], ARGV[1], data[11], state, step, due, data[12], ARGV[3], ARGV[9]) then
  return {'paused'}
end
release_if_resumed(KEYS[1], KEYS[2], KEYS[10], KEYS[9], ARGV[1], data[11], state, step, data[12], ARGV[3], ARGV[5])
if reclaim then
  -- The lost worker may have sent a call up to the end of its lease (it renews before each call): the
  -- late window starts there (tasks/runner.py settle), whatever the verdict, for the step that runs now
  -- or the person the flow stops for. (No version moved: a fact that only makes later reads wait longer.)
  local ended = lease_until or ARGV[3]
  local known = tonumber(redis.call('HGET', KEYS[1], 'maybe_sent') or '')
  if not known or known < tonumber(ended) then
    redis.call('HSET', KEYS[1], 'maybe_sent', ended)
  end
  redis.call('HSET', KEYS[1], 'uncertain', '1')
end
local held = ARGV[10] or ''
local definition = data[13] or ''
if definition == '' and held ~= '' then  -- a record of an earlier release: its kind's first version
  local mark = ' ' .. (data[11] or '') .. '='
  local at = string.find(held, mark, 1, true)
  definition = at and string.match(string.sub(held, at + #mark), '^(%S+)') or ''
end
if held ~= '' then
  if definition == '' or not string.find(held, ' ' .. definition .. ' ', 1, true) then
    -- No code here for the flow's own definition: it waits, counted and listed as parked, never failed.
    local again = now + tonumber(ARGV[11])
    local version = tonumber(data[7]) + 1
    redis.call('HSET', KEYS[1], 'state', 'parked', 'version', version, 'updated', ARGV[3], 'due', again)
    if state == 'running' then
      redis.call('HDEL', KEYS[1], 'lease_until', 'lease_owner')
    end
    redis.call('ZADD', KEYS[3], again, ARGV[1])
    if old_index ~= KEYS[11] then
      redis.call('ZREM', old_index, ARGV[1])
      redis.call('ZADD', KEYS[11], ARGV[3], ARGV[1])
      redis.call('RPUSH', KEYS[2], '{"by":' .. cjson.encode(ARGV[5]) .. ',"from":' .. cjson.encode(state) ..
        ',"step":' .. cjson.encode(ARGV[2]) .. ',"t":' .. ARGV[3] .. ',"to":"parked","what":' ..
        cjson.encode('parked: no process here holds definition ' .. (definition ~= '' and definition or '(unknown)')) .. '}')
    end
    return {'parked'}
  end
end
local runs = tonumber(data[8] or '0') or 0
local verdict = 'ok'
if reclaim and attempt >= tonumber(ARGV[6]) then
  verdict = 'lost'
elseif runs >= tonumber(ARGV[7]) then
  verdict = 'looping'
end
if verdict == 'ok' then
  local version = tonumber(data[7]) + 1
  redis.call('HSET', KEYS[1], 'state', 'running', 'version', version, 'updated', ARGV[3], 'due', ARGV[4],
    'attempt', attempt + 1, 'lease_until', ARGV[4], 'lease_owner', ARGV[5], 'runs', runs + 1)
  local what = 'claimed ' .. ARGV[2]
  -- Judged by the flow's own definition (kind@version), never by another version's step of that name;
  -- by kind only when no definition is known (no ARGV 10: every definition held).
  local marks = ARGV[8] ~= '' and cjson.decode(ARGV[8])
  local money = marks and marks['ops'][definition ~= '' and definition or data[11]]
  if money and not in_flight(data[10]) and data[6] ~= '1' and not data[9] then
    redis.call('HSET', KEYS[1], 'unsettled', cjson.encode({step = ARGV[2], op = money, t = tonumber(ARGV[3]), v = marks['v']}))
  end
  if reclaim then
    what = what .. ' after the lease ran out'
  end
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
  if old_index ~= KEYS[8] then
    redis.call('ZREM', old_index, ARGV[1])
  end
  redis.call('ZADD', KEYS[8], ARGV[3], ARGV[1])
  -- The log entry in FlowStore._entry's form (sorted keys); "t" keeps the caller's exact number.
  redis.call('RPUSH', KEYS[2], '{"by":' .. cjson.encode(ARGV[5]) .. ',"from":' .. cjson.encode(state) ..
    ',"step":' .. cjson.encode(ARGV[2]) .. ',"t":' .. ARGV[3] .. ',"to":"running","what":' .. cjson.encode(what) .. '}')
  if redis.call('PERSIST', KEYS[1]) == 1 then  -- (a log has an end only while its record has one)
    redis.call('PERSIST', KEYS[2])
  end
end
local result = {verdict, state}
for _, item in ipairs(redis.call('HGETALL', KEYS[1])) do
  table.insert(result, item)
end
return result
