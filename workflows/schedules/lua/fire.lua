-- needs: engine/lua/create_flow.lua schedules/lua/change.lua
-- The scheduler's fire of one schedule on a single server, in one script (ScheduleStore.fire_many): the
-- schedule's change (update_schedule, compare-and-set on its version: it records the occurrences about to
-- start before they start), their flows' creates (create_flow, each exactly as engine/lua/create.lua makes
-- it: one flow per flow id, a gateway order id another flow holds refused with nothing written), then the
-- mark of the attempts whose flow is there (mark_schedule). A change refused (another writer got there
-- first, or this very call sent again after a lost answer) creates and marks nothing.
-- KEYS: update.lua's 8, then each create's own (6, or 7 with its order lookup), one create after another.
-- ARGV: update.lua's 12; 13 n creates; 14 the open attempts of the changed record with every attempt these
-- creates start marked created (JSON, as mark.lua takes it): written when each create's flow is there (the
-- usual case); when one is not (refused), nothing is marked here and the caller marks the others (mark.lua);
-- then per create its number of keys, its number of arguments, the input hash of its start (a flow found
-- existing with it is this start's), and its arguments.
-- Returns {0} when the change was refused; else {the schedule's version, 1 when the attempts were marked,
-- each create's answer}.
local version = update_schedule(KEYS, ARGV)
if version == 0 then
  return {0}
end
local answers = {version, 0}
local k, a = 8, 14
local all = true
for n = 1, tonumber(ARGV[13]) do
  local nkeys, nargs, digest = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), ARGV[a + 3]
  local keys, args = {}, {}
  for i = 1, nkeys do
    keys[i] = KEYS[k + i]
  end
  for i = 1, nargs do
    args[i] = ARGV[a + 3 + i]
  end
  local answer = create_flow(keys, args)
  answers[n + 2] = answer
  all = all and (answer[1] == 1 or (answer[1] == 0 and answer[2] == digest))
  k, a = k + nkeys, a + 3 + nargs
end
if all and tonumber(ARGV[13]) > 0 then
  answers[1] = mark_schedule({KEYS[1]}, {tostring(version), ARGV[14], ARGV[7]})
  answers[2] = 1
end
return answers
