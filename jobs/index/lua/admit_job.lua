-- admit_job.lua: the admit step (prepended, after common.lua, to admit.lua and admit_new.lua).

-- Index a new job (attempt 1) if its tier holds fewer than bound queued jobs, its tenant
-- fewer than quota (nil: none) and at most max_position (nil: any) jobs would be ahead of it.
-- Returns {accepted 0/1, tier_queued, tenant_queued, position, reason or '', duplicate 0/1}:
-- the counts after the call (before it, if refused); a job already indexed is accepted as a
-- duplicate, changing nothing, at its rank when queued, the rank it would have when delayed,
-- 0 when leased.
local function admit_job(job, tenant, tier, order_key, start_by, not_before, bound, quota,
                         max_position)
  local tier_queued = tier_waiting(tier)
  local queued = tenant_queued(tenant)
  local known = locate(job, tenant, tier)
  if known then
    local position = 0  -- leased
    if known.state == 'queued' or known.state == 'delayed' then
      position = rank_of(known.order_key, job)
    end
    return {1, tier_queued, queued, position, '', 1}
  end
  if tier_queued >= bound then
    return {0, tier_queued, queued, rank_of(order_key, job), 'capacity', 0}
  end
  if quota and queued >= quota then
    return {0, tier_queued, queued, rank_of(order_key, job), 'tenant_limit', 0}
  end
  if max_position then
    local ahead = rank_of(order_key, job)
    if ahead > max_position then return {0, tier_queued, queued, ahead, 'deadline', 0} end
  end
  index_job(job, tenant, tier, order_key, start_by, not_before, 1)
  return {1, tier_queued + 1, queued + 1, rank_of(order_key, job), '', 0}
end
