-- The gateway gate of one terminal (workflows/engine/gate.py): circuit breaker, shared rate limiter and the hold
-- of a 429's Retry-After, decided in one round trip per gateway call with Redis's own clock (TIME), so
-- that every worker shares one clock and one view of the gateway's health.
-- KEYS: 1 the terminal's gate (hash), 2 the merchant event stream of the gate's partition (same slot:
--       the events gateway.unavailable / gateway.recovered are written with the change that causes them).
-- ARGV: 1 what: take | fail | ok | limited
--       2 failures that open the breaker, 3 their window (seconds), 4 seconds the breaker stays open,
--       5 rate (calls per second; 0: no limiter, no shared hold), 6 burst, 7 the probe's lease (seconds),
--       8 the terminal's name, 9 take: the slot this caller reserved earlier ("" none);
--       fail: the error (JSON); limited: the Retry-After (seconds, "" when none),
--       10 "now" for tests ("": Redis TIME),
--       11 take: slots wanted at once (the process's share, workflows/engine/gate.py; 0: it holds slots granted
--          before and only asks the breaker, a read: no write, so no fsync, on most calls).
-- Replies {verdict, time, now, report, granted} (times as strings: Lua numbers would be cut to integers):
--   take    -> {'go', now, now, report, n} call now; report "1": tell the outcome (failures counted, or
--                                          probe); n slots taken for the caller's process (this call's
--                                          included)
--              {'void', now, now, report}  the slots the caller holds are void (a 429's hold came since):
--                                          ask again for fresh ones
--              {'wait', slot, now}        the caller's slot (reserved: pass it back as ARGV 9 at that time)
--              {'open', until, now}       the breaker is open (or another caller probes): not before until
--   fail    -> {'open', until, now} | {'closed', failures, now}
--   ok      -> {'closed', 0, now}
--   limited -> {'wait', slot, now}        a fresh slot for the limited caller, after the hold
local gate = KEYS[1]
local what = ARGV[1]
local threshold = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local open_seconds = tonumber(ARGV[4])
local rate = tonumber(ARGV[5])
local burst = math.max(1, tonumber(ARGV[6]))
local probe_lease = tonumber(ARGV[7])
local now
if ARGV[10] ~= '' then
  now = tonumber(ARGV[10])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function str(x)
  return string.format('%.6f', x)
end
local function reply(verdict, t, report, granted)
  return {verdict, type(t) == 'number' and str(t) or t, str(now), report or '0', tostring(granted or 0)}
end
local h = redis.call('HMGET', gate, 'open_until', 'probe_until', 'fails', 'fail_since', 'tat', 'hold_until', 'opened')
local open_until = tonumber(h[1])
local probe_until = tonumber(h[2])
local fails = tonumber(h[3]) or 0
local fail_since = tonumber(h[4])
local tat = tonumber(h[5]) or now
local hold_until = tonumber(h[6]) or 0
local opened = tonumber(h[7])

local function event(kind, data)
  data['terminal'] = ARGV[8]
  redis.call('XADD', KEYS[2], '*', 'e', cjson.encode({type = kind, time = now, data = data}))
end

-- A slot from the limiter (GCRA): tat is when the bucket is empty again; a caller may go once the debt
-- beyond the burst is paid. The slot is taken (reserved) whether it is now or later.
local function slot()
  local interval = 1 / rate
  local base = math.max(tat, now)
  local at = math.max(base - (burst - 1) * interval, now)
  redis.call('HSET', gate, 'tat', str(base + interval))
  return at
end

if what == 'take' then
  if open_until then
    if now < open_until then
      redis.call('HINCRBY', gate, 'deferred', 1)
      return reply('open', open_until)
    end
    if probe_until and now < probe_until then
      -- Another caller probes: look again soon (its answer closes the breaker or opens it again).
      redis.call('HINCRBY', gate, 'deferred', 1)
      return reply('open', math.min(probe_until, now + 1))
    end
    -- Half open: this caller is the one probe (until its lease ends, when another may probe).
    redis.call('HSET', gate, 'probe_until', str(now + probe_lease))
    redis.call('HINCRBY', gate, 'probes', 1)
    return reply('go', now, '1')
  end
  local report = fails > 0 and '1' or '0'
  if rate <= 0 then
    return reply('go', now, report)
  end
  if ARGV[9] ~= '' then
    local reserved = tonumber(ARGV[9])
    -- Its own slot, reserved when it was deferred: not taken twice. (Void if a hold came since, or if it
    -- comes back so late that the slot has long been given back to the rate.)
    if reserved and reserved <= now + 0.05 and reserved >= hold_until and reserved > now - 60 then
      return reply('go', now, report)
    end
  end
  local want = tonumber(ARGV[11]) or 1
  if want <= 0 then
    -- The caller's process holds slots granted before: void only if a 429's hold came since.
    if hold_until > now then
      return reply('void', now, report)
    end
    return reply('go', now, report)
  end
  local interval = 1 / rate
  local base = math.max(tat, now)
  local first = base - (burst - 1) * interval
  if first > now then
    local at = slot()
    redis.call('HINCRBY', gate, 'waits', 1)
    return reply('wait', at)
  end
  -- The slots free now (the bucket's tokens), at most the share asked for.
  local free = math.floor((now - first) / interval + 1e-9) + 1
  local granted = math.max(1, math.min(want, free))
  redis.call('HSET', gate, 'tat', str(base + granted * interval))
  return reply('go', now, report, granted)
end

if what == 'fail' then
  if open_until then
    if now >= open_until then
      -- Half open and the probe failed (or a call that began before): open again.
      open_until = now + open_seconds
      redis.call('HSET', gate, 'open_until', str(open_until))
      redis.call('HDEL', gate, 'probe_until')
    end
    return reply('open', open_until)
  end
  if not fail_since or now - fail_since > window then
    fails = 0
    fail_since = now
  end
  fails = fails + 1
  if fails >= threshold then
    open_until = now + open_seconds
    redis.call('HSET', gate, 'open_until', str(open_until), 'opened', str(now), 'fails', fails)
    redis.call('HDEL', gate, 'fail_since', 'probe_until')
    redis.call('HINCRBY', gate, 'opened_total', 1)
    local ok, err = pcall(cjson.decode, ARGV[9])
    event('gateway.unavailable', {failures = fails, ['until'] = open_until, error = ok and err or cjson.null})
    return reply('open', open_until)
  end
  redis.call('HSET', gate, 'fails', fails, 'fail_since', str(fail_since))
  return reply('closed', tostring(fails))
end

if what == 'ok' then
  redis.call('HDEL', gate, 'fails', 'fail_since', 'probe_until')
  if open_until then
    redis.call('HDEL', gate, 'open_until', 'opened')
    event('gateway.recovered', {since = opened or cjson.null, seconds = opened and (now - opened) or cjson.null})
  end
  return reply('closed', '0')
end

if what == 'limited' then
  redis.call('HINCRBY', gate, 'limited', 1)
  if rate <= 0 then
    return reply('wait', now)
  end
  local after = tonumber(ARGV[9]) or 1
  local hold = math.max(hold_until, now + after)
  -- One 429 slows every worker: nobody before the hold ends, and the bucket empty then (no burst at once).
  redis.call('HSET', gate, 'hold_until', str(hold))
  tat = math.max(tat, hold + (burst - 1) / rate)
  return reply('wait', slot())
end
return redis.error_reply('gate.lua: unknown ' .. tostring(what))
