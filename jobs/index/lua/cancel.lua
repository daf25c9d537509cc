-- cancel.lua: remove a queued or delayed job; re-file its tenant.
-- KEYS[1] prefix  [2] runnable  [3] blocked  [4] queued  [5] delayed  [6] deadlines
--      [7] leases  [8] meta  [9] tier_caps  [10] tenant_caps  [11] tenant_tier
--      [12] tenant_delayed  (the layout of common.lua, which is prepended)
-- ARGV[1] job
-- Returns 1 when removed, 0 when the job is not queued or delayed (leased, unknown).
local job = ARGV[1]
if not (redis.call('ZSCORE', QUEUED, job) or redis.call('ZSCORE', DELAYED, job)) then
  return 0
end
unindex(job, meta_of(job))
return 1
