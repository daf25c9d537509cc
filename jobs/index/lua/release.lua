-- release.lua: drop a lease; re-file its tenant.
-- KEYS[1] prefix  [2] runnable  [3] blocked  [4] queued  [5] delayed  [6] deadlines
--      [7] leases  [8] meta  [9] tier_caps  [10] tenant_caps  [11] tenant_tier
--      [12] tenant_delayed  (the layout of common.lua, which is prepended)
-- ARGV[1] job
-- Returns 1 when the tenant moved from blocked to runnable, else 0 (also: no such lease).
local job = ARGV[1]
if not redis.call('ZSCORE', LEASES, job) then return 0 end
local tenant = meta_of(job)[1]
redis.call('ZREM', LEASES, job)
redis.call('ZREM', lkey(tenant), job)
redis.call('HDEL', META, job)
local head = head_of(tenant)
if head and refile(tenant, head) then return 1 end
return 0
