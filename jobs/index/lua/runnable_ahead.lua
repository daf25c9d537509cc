-- runnable_ahead.lua: how many queued jobs ahead of a queued job take a free slot before it.
-- KEYS: the layout of common.lua (prepended).
-- ARGV[1] the job's order key  ARGV[2] the most to count (the free slots)  ARGV[3] the job
-- Returns runnable_ahead (common.lua) at the job's order key, the job itself left out.
return runnable_ahead(ARGV[1], tonumber(ARGV[2]), ARGV[3])
