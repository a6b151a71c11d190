-- needs: schedules/lua/change.lua
-- Mark a schedule's open attempts created (schedules/lua/change.lua's mark_schedule says how).
return mark_schedule(KEYS, ARGV)
