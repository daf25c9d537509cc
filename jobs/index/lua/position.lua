-- position.lua: a queued job's position (queued jobs ahead of it, every tier, ties by id).
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1] job
-- Returns the position, or nil when the job is not queued (delayed, leased or unknown).
local job = ARGV[1]
local m = meta_of(job)
local score
if m then
  score = redis.call('ZSCORE', tkey(m[2]), job)
else
  local _
  _, score = queued_in(job, nil)
end
if not score then return nil end
return rank_of(score, job)
