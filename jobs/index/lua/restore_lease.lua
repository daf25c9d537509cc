-- restore_lease.lua: make sure an in-flight job holds a lease until at least expires_at
-- (a rebuild from SQL: the job is dispatched or running). A lease that ends later is kept;
-- a queued or delayed entry of the job is left alone (it was re-queued since SQL was read).
-- KEYS[1] prefix  [2] runnable  [3] blocked  [4] queued  [5] delayed  [6] deadlines
--      [7] leases  [8] meta  [9] tier_caps  [10] tenant_caps  [11] tenant_tier
--      [12] tenant_delayed  (the layout of common.lua, which is prepended)
-- ARGV[1] job  ARGV[2] tenant  ARGV[3] tier  ARGV[4] order_key  ARGV[5] start_by ('' none)
-- ARGV[6] not_before ('' none)  ARGV[7] expires_at
-- Returns 1 when the job holds a lease now, 0 when it is queued or delayed.
local job, tenant, tier, expires_at = ARGV[1], ARGV[2], ARGV[3], ARGV[7]
if redis.call('ZSCORE', QUEUED, job) or redis.call('ZSCORE', DELAYED, job) then return 0 end
local current = redis.call('ZSCORE', LEASES, job)
if current then
  if tonumber(current) < tonumber(expires_at) then
    redis.call('ZADD', LEASES, 'XX', expires_at, job)
    redis.call('ZADD', lkey(meta_of(job)[1]), 'XX', expires_at, job)
  end
  return 1
end
redis.call('HSET', META, job, cjson.encode({tenant, tier, ARGV[4], ARGV[5], ARGV[6]}))
redis.call('ZADD', lkey(tenant), expires_at, job)
redis.call('ZADD', LEASES, expires_at, job)
if redis.call('HGET', TENANT_TIER, tenant) ~= tier then  -- its cap may have changed
  redis.call('HSET', TENANT_TIER, tenant, tier)
  local head = head_of(tenant)
  if head then refile(tenant, head) end
end
return 1
