-- reap.lua: remove leases that expired at or before now, oldest first (ties by job id).
-- KEYS[1] prefix  [2] runnable  [3] blocked  [4] queued  [5] delayed  [6] deadlines
--      [7] leases  [8] meta  [9] tier_caps  [10] tenant_caps  [11] tenant_tier
--      [12] tenant_delayed  (the layout of common.lua, which is prepended)  [13] leader
-- ARGV[1] now  ARGV[2] limit (> 0)  ARGV[3] the caller's fencing token ('' unfenced)
-- Returns {{job, tenant, tier, order_key, expires_at}, ...}; fails NOTLEADER, changing
-- nothing, when the token is not the leader's.
if fenced_out(ARGV[3]) then return redis.error_reply(NOT_LEADER) end
local due = redis.call('ZRANGEBYSCORE', LEASES, '-inf', ARGV[1], 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for i = 1, #due, 2 do
  local job = due[i]
  local m = meta_of(job)
  unindex(job, m)
  out[#out + 1] = {job, m[1], m[2], m[3], due[i + 1]}
end
return out
