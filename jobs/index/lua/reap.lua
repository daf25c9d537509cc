-- reap.lua: remove leases that expired at or before now, oldest first (ties by job id).
-- KEYS: the layout of common.lua, which is prepended (KEYS[13] the leader lock).
-- ARGV[1] now ('' Redis's clock)  ARGV[2] limit (> 0)  ARGV[3] the caller's fencing token
-- Returns {{job, tenant, tier, order_key, expires_at, attempt, start_by ('' none)}, ...};
-- fails NOTLEADER, changing nothing, when the token is not the leader's.
if fenced_out(ARGV[3]) then return redis.error_reply(NOT_LEADER) end
local now = now_or_server(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for i = 1, #due, 2 do
  local job = due[i]
  local e = locate(job, nil, nil)  -- a lease has meta
  unindex(job, e)
  out[#out + 1] = {job, e.tenant, e.tier, e.order_key, due[i + 1], e.attempt, e.start_by}
end
return out
