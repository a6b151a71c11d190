-- needs: schedules/lua/change.lua
-- Compare-and-set one change of a schedule (schedules/lua/change.lua's update_schedule says how).
return update_schedule(KEYS, ARGV)
