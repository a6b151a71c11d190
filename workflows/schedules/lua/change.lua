-- A schedule's two compare-and-set writes, as functions, each the one home of its rules: update.lua and
-- mark.lua run one alone, the scheduler's fire.lua both around its flows' creates. Each function's KEYS
-- and ARGV are the script's own, as that script is called.

-- Compare-and-set one change of a schedule. KEYS: record, log, due, old-state index, new-state index,
-- the merchant event stream, the ended set (schedules finished, scored by when: ScheduleStore.trim_ended),
-- the tombstone of its create key (ScheduleKeys.tombstone).
-- ARGV: 1 id, 2 expected version, 3 new state, 4 the fields that changed (JSON object of strings), 5 due score ("" removes
-- the schedule from the due set), 6 log entries (JSON list of JSON strings), 7 now, 8 created,
-- 9 merchant events of the change (JSON list of JSON strings): written here, with it, or not at all,
-- 10 seconds a schedule that has ended (final, nothing in flight: ScheduleRecord.ended) is kept ("": it has
-- not ended), 11 most history entries kept, 12 seconds the tombstone of an ended schedule's create key
-- lives ("": it has not ended, or was created without a key).
-- Returns the new version, or 0 when the version did not match (another writer got there first).
local function update_schedule(KEYS, ARGV)
  local current = redis.call('HGET', KEYS[1], 'version')
  if current ~= ARGV[2] then
    return 0
  end
  local version = tonumber(current) + 1
  local fields = {'state', ARGV[3], 'version', version, 'updated', ARGV[7]}
  for name, value in pairs(cjson.decode(ARGV[4])) do
    fields[#fields + 1] = name
    fields[#fields + 1] = value
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  if ARGV[5] == '' then
    redis.call('ZREM', KEYS[3], ARGV[1])
  else
    redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
  end
  if KEYS[4] ~= KEYS[5] then
    redis.call('ZREM', KEYS[4], ARGV[1])
    redis.call('ZADD', KEYS[5], ARGV[8], ARGV[1])
  end
  for _, entry in ipairs(cjson.decode(ARGV[6])) do
    redis.call('RPUSH', KEYS[2], entry)
  end
  for _, event in ipairs(cjson.decode(ARGV[9])) do
    redis.call('XADD', KEYS[6], '*', 'e', event)
  end

  -- The history keeps its first entry (how the schedule was created) and the newest ones, ARGV[11] in all:
  -- the entries between are summed up in the second, {event = "earlier entries", t, until, entries,
  -- counts = {<event> = n}}, so that the history still says how many occurrences were charged, declined,
  -- retried, skipped or coalesced: an entry counts under its event the occurrences it tells of (its
  -- ``count``, else one), and a "missed" entry adds the occurrences its policy did not fire to "skipped"
  -- (missed: skip) or "coalesced" (missed: once), as the record's counters do (workflows/schedules/policy.py).
  local cap = tonumber(ARGV[11])
  local length = redis.call('LLEN', KEYS[2])
  if length > cap then
    local summary = cjson.decode(redis.call('LINDEX', KEYS[2], 1))
    local first = 2
    if summary['event'] ~= 'earlier entries' then
      summary = {event = 'earlier entries', t = summary['t'], entries = 0, counts = {}}
      first = 1
    end
    local kept_from = length - (cap - 2)
    for _, raw in ipairs(redis.call('LRANGE', KEYS[2], first, kept_from - 1)) do
      local entry = cjson.decode(raw)
      local name = tostring(entry['event'])
      local n = 1
      if type(entry['count']) == 'number' then
        n = entry['count']
      end
      summary['counts'][name] = (summary['counts'][name] or 0) + n
      if name == 'missed' then
        for _, counter in ipairs({'skipped', 'coalesced'}) do
          if type(entry[counter]) == 'number' then
            summary['counts'][counter] = (summary['counts'][counter] or 0) + entry[counter]
          end
        end
      end
      summary['entries'] = summary['entries'] + 1
      summary['until'] = entry['t']
    end
    local created = redis.call('LINDEX', KEYS[2], 0)
    redis.call('LTRIM', KEYS[2], kept_from, -1)
    redis.call('LPUSH', KEYS[2], cjson.encode(summary), created)
  end

  -- An ended schedule is kept for its retention, then its record and history expire; the scheduler drops
  -- its index entries once they are gone (ScheduleStore.trim_ended).
  if ARGV[10] ~= '' then
    redis.call('EXPIRE', KEYS[1], ARGV[10])
    redis.call('EXPIRE', KEYS[2], ARGV[10])
    redis.call('ZADD', KEYS[7], ARGV[7], ARGV[1])
  end
  if ARGV[12] ~= '' then
    redis.call('SET', KEYS[8], ARGV[7], 'EX', ARGV[12])
  end
  return version
end

-- Mark a schedule's open attempts as created (their flows were just started), compare-and-set on the
-- version: the scheduler's second write of a batch. Only the open attempts change (no state, due score,
-- history or event), so nothing else is sent or rewritten. KEYS: record. ARGV: 1 expected version,
-- 2 open attempts (JSON), 3 now. Returns the new version, or 0 when another writer got there first.
local function mark_schedule(KEYS, ARGV)
  local current = redis.call('HGET', KEYS[1], 'version')
  if current ~= ARGV[1] then
    return 0
  end
  local version = tonumber(current) + 1
  redis.call('HSET', KEYS[1], 'open', ARGV[2], 'version', version, 'updated', ARGV[3])
  return version
end
