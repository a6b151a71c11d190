-- needs: engine/lua/events.lua
-- The create of one flow, the one home of its rules: create.lua runs it alone, the scheduler's fire.lua
-- (schedules/lua) inside its own script, with the schedule's writes; its KEYS and ARGV are the create's own.
-- Create a flow unless it exists. KEYS: flow, log, due, state index, kind index, event stream, and on a
-- single server the flow's order lookup (absent on a cluster, where it sits in the order id's slot).
-- ARGV: flow id, now, log entry (JSON), due time, "1" to emit flow.created, then the record's fields
-- as name, value pairs (state, step, kind and order_id among them, input_hash too), written in one HSET
-- with the ones every new record has (id, version 1, attempt 0, created and updated now, due).
-- Returns {1, "", pointed} when created, {0, <stored input hash>, 0} when the flow already existed,
-- {2, <holder>, 0} when the order lookup names another flow: nothing is written (a gateway order id is
-- one flow's as long as its lookup lives, that is until the retention after that flow ended: a payment
-- on it is that flow's, and a second flow naming it could only be refused by the gateway, or take that
-- flow's money for its own). pointed is 1 when the order lookup was free and now names the new flow
-- (OrderIndex.claim's move, made here to save the start a round trip); 0 leaves it to OrderIndex.claim.
--
-- Whether the flow exists, and its input hash, in one read: every record has its version (a packed one
-- too: it stays plain), and nothing writes a flow's hash without one.
local function create_flow(KEYS, ARGV)
  local found = redis.call('HMGET', KEYS[1], 'version', 'input_hash')
  if found[1] then
    return {0, found[2] or '', 0}
  end
  -- The order lookup pointed first (HSETNX), its holder read only when it was not free: a lookup another
  -- flow holds refuses the start with nothing written (HSETNX wrote nothing either).
  local pointed = 0
  if KEYS[7] then
    pointed = redis.call('HSETNX', KEYS[7], 'flow', ARGV[1])
    if pointed == 0 then
      local holder = redis.call('HGET', KEYS[7], 'flow')
      if holder and holder ~= ARGV[1] then
        return {2, holder, 0}
      end
    end
  end
  -- The fields every new record has from the fixed arguments (id, times, due; its first version and
  -- attempt), then the ones passed: fewer arguments to pack for every start.
  redis.call('HSET', KEYS[1], 'id', ARGV[1], 'version', '1', 'attempt', '0', 'created', ARGV[2], 'updated', ARGV[2],
    'due', ARGV[4], unpack(ARGV, 6))
  local fields = {}
  for i = 6, #ARGV, 2 do
    fields[ARGV[i]] = ARGV[i + 1]
  end
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
  redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
  redis.call('ZADD', KEYS[5], ARGV[2], ARGV[1])
  redis.call('RPUSH', KEYS[2], ARGV[3])
  if ARGV[5] == '1' then
    local run_at = cjson.null
    if fields['state'] == 'sleeping' then
      run_at = tonumber(ARGV[4])
    end
    -- The record's kind and order id are the ones just written: no read back.
    emit(KEYS[6], KEYS[1], ARGV[1], 'flow.created', ARGV[2], {state = fields['state'], step = fields['step'], runAt = run_at},
      {fields['kind'], fields['order_id'] or false, false, false, fields['terminal'] or false})
  end
  return {1, '', pointed}
end
