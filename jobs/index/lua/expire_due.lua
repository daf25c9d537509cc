-- expire_due.lua: remove queued or delayed jobs whose start_by is at or before now, by
-- start_by (ties by job id).
-- KEYS[1] prefix  [2] runnable  [3] blocked  [4] queued  [5] delayed  [6] deadlines
--      [7] leases  [8] meta  [9] tier_caps  [10] tenant_caps  [11] tenant_tier
--      [12] tenant_delayed  (the layout of common.lua, which is prepended)  [13] leader
-- ARGV[1] now  ARGV[2] limit (> 0)  ARGV[3] the caller's fencing token ('' unfenced)
-- Returns {{job, tenant, tier, order_key, start_by, not_before ('' none)}, ...}; fails
-- NOTLEADER, changing nothing, when the token is not the leader's.
if fenced_out(ARGV[3]) then return redis.error_reply(NOT_LEADER) end
local due = redis.call('ZRANGEBYSCORE', DEADLINES, '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, job in ipairs(due) do
  local m = meta_of(job)
  unindex(job, m)
  out[#out + 1] = {job, m[1], m[2], m[3], m[4], m[5]}
end
return out
