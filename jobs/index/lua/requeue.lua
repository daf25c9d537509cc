-- requeue.lua: index jobs again without bound checks, replacing any entry of the same id.
-- KEYS[1] prefix  [2] runnable  [3] blocked  [4] queued  [5] delayed  [6] deadlines
--      [7] leases  [8] meta  [9] tier_caps  [10] tenant_caps  [11] tenant_tier
--      [12] tenant_delayed  (the layout of common.lua, which is prepended)
-- ARGV: groups of six, one per job: job, tenant, tier, order_key, start_by ('' none),
--       not_before ('' none). Returns the number of jobs indexed.
local count = 0
for i = 1, #ARGV, 6 do
  local job = ARGV[i]
  local m = meta_of(job)
  if m then unindex(job, m) end
  index_job(job, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5])
  count = count + 1
end
return count
