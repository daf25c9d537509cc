-- admit.lua: index a job if its tier and tenant are under their bounds, atomically.
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1] job  ARGV[2] tenant  ARGV[3] tier  ARGV[4] order_key  ARGV[5] start_by ('' none)
-- ARGV[6] not_before ('' none)  ARGV[7] bound  ARGV[8] tenant quota ('' none)
-- ARGV[9] max position ('' none): refuse ('deadline') a job with more jobs ahead of it
-- Returns {accepted 0/1, tier_queued, tenant_queued, position, reason or '', duplicate 0/1}.
-- A new job is attempt 1.
local job, tenant, tier, order_key = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local bound, quota, max_position = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])

-- Queued jobs ahead of (score, job) when the job is not in queued: O(log n), ties included.
local function rank_at(score)
  redis.call('ZADD', QUEUED, score, job)
  local rank = redis.call('ZRANK', QUEUED, job)
  redis.call('ZREM', QUEUED, job)
  return rank
end

local tier_queued = redis.call('ZCARD', tkey(tier))
local queued = tenant_queued(tenant)
local m = meta_of(job)
if m then
  local position = redis.call('ZRANK', QUEUED, job)
  if not position then
    if redis.call('ZSCORE', DELAYED, job) then position = rank_at(m[3]) else position = 0 end
  end
  return {1, tier_queued, queued, position, '', 1}
end
if tier_queued >= bound then
  return {0, tier_queued, queued, rank_at(order_key), 'capacity', 0}
end
if quota and queued >= quota then
  return {0, tier_queued, queued, rank_at(order_key), 'tenant_limit', 0}
end
if max_position then
  local ahead = rank_at(order_key)
  if ahead > max_position then return {0, tier_queued, queued, ahead, 'deadline', 0} end
end
index_job(job, tenant, tier, order_key, ARGV[5], ARGV[6], 1)
local position = redis.call('ZRANK', QUEUED, job)
if not position then position = rank_at(order_key) end
return {1, tier_queued + 1, queued + 1, position, '', 0}
