-- Pause of a flow kind (workflows/pauses.py): the one rule, prepended to claim.lua, hold.lua and
-- release.lua. A paused kind's flows run no step: a claim or a dispatch that meets one leaves its state
-- as it is (nothing ends, money in flight stays recorded) and moves its due entry to the re-check; the
-- first hold under a pause logs it once and lists the flow in the partition's held set, so that a
-- resume finds it at once (release.lua) and logs the resume once.
-- paused: the partition's hash flow kind -> JSON {id, by, at, reason} (a copy of the pause written to
-- every partition); held: the partition's sorted set of "<kind>\31<flow id>" (all scores 0: one lex range
-- per kind).
local function paused_entry(by, state, step, now, what)
  return '{"by":' .. cjson.encode(by) .. ',"from":' .. cjson.encode(state) .. ',"step":' .. cjson.encode(step) ..
    ',"t":' .. now .. ',"to":' .. cjson.encode(state) .. ',"what":' .. cjson.encode(what) .. '}'
end

-- Hold the flow when its kind is paused: true (held; due moved to the re-check), false (not paused).
local function hold_if_paused(flow, log, due, paused, held, id, kind, state, step, record_due, held_by, now, recheck)
  if not kind then
    return false
  end
  local raw = redis.call('HGET', paused, kind)
  if not raw then
    return false
  end
  local pause = cjson.decode(raw)
  local later = tonumber(now) + tonumber(recheck)
  local own = tonumber(record_due or '')
  if own and own > later then
    later = own
  end
  redis.call('ZADD', due, later, id)
  if held_by ~= pause.id then
    redis.call('HSET', flow, 'held', pause.id)
    redis.call('ZADD', held, 0, kind .. '\31' .. id)
    local who = pause.by or 'operator'
    redis.call('RPUSH', log, paused_entry(who, state, step or '', now,
      'held: flow kind ' .. kind .. ' paused by ' .. who .. ' (' .. (pause.reason or '') .. ')'))
  end
  return true
end

-- Log the resume once for a flow held under a pause that has ended (its kind no longer paused, or
-- paused again since: then the new pause holds it anew), and take it off the held set. ``who``: the
-- resume's (release.lua), or the claim's owner when a worker meets the flow first.
local function release_if_resumed(flow, log, held, paused, id, kind, state, step, held_by, now, who)
  if not held_by or not kind then
    return false
  end
  local raw = redis.call('HGET', paused, kind)
  if raw and cjson.decode(raw).id == held_by then
    return false
  end
  redis.call('HDEL', flow, 'held')
  redis.call('ZREM', held, kind .. '\31' .. id)
  redis.call('RPUSH', log, paused_entry(who, state, step or '', now, 'released: flow kind ' .. kind .. ' resumed'))
  return true
end
