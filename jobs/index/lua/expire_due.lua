-- expire_due.lua: remove queued or delayed jobs whose start_by is at or before now, by
-- start_by (ties by job id).
-- KEYS: the layout of common.lua, which is prepended (KEYS[13] the leader lock).
-- ARGV[1] now ('' Redis's clock)  ARGV[2] limit (> 0)  ARGV[3] the caller's fencing token
-- Returns {{job, tenant, tier, order_key, start_by, not_before ('' none), attempt}, ...}; fails
-- NOTLEADER, changing nothing, when the token is not the leader's.
if fenced_out(ARGV[3]) then return redis.error_reply(NOT_LEADER) end
local now = now_or_server(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', DEADLINES, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, job in ipairs(due) do
  local e = locate(job, nil, nil)  -- a job with a start_by has meta
  unindex(job, e)
  out[#out + 1] = {job, e.tenant, e.tier, e.order_key, e.start_by, e.not_before, e.attempt}
end
return out
