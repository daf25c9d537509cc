-- position_at.lua: queued jobs with an order key at or below ARGV[1], every tier (ties count
-- as ahead: a new job's id sorts after the ids already there).
-- KEYS: the layout of common.lua, which is prepended.
return count_upto(ARGV[1])
