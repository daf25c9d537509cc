-- renew.lua: move a lease's expiry, only while the lease exists.
-- KEYS[1] prefix  [2] runnable  [3] blocked  [4] queued  [5] delayed  [6] deadlines
--      [7] leases  [8] meta  [9] tier_caps  [10] tenant_caps  [11] tenant_tier
--      [12] tenant_delayed  (the layout of common.lua, which is prepended)
-- ARGV[1] job  ARGV[2] expires_at
-- Returns 1 when renewed, 0 when the lease is gone.
local job, expires_at = ARGV[1], ARGV[2]
if not redis.call('ZSCORE', LEASES, job) then return 0 end
redis.call('ZADD', LEASES, 'XX', expires_at, job)
redis.call('ZADD', lkey(meta_of(job)[1]), 'XX', expires_at, job)
return 1
