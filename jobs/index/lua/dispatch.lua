-- dispatch.lua: promote due delayed jobs, then lease up to n jobs in order-key order across
-- runnable tenants; a tenant found at its cap moves to blocked (it does not count toward n).
-- KEYS: the layout of common.lua, which is prepended (KEYS[13] the leader lock).
-- ARGV[1] n  ARGV[2] now ('' Redis's clock)  ARGV[3] lease ttl in seconds
-- ARGV[4] promote limit  ARGV[5] the caller's fencing token ('' unfenced)
-- ARGV[6] the pool's capacity ('' none): n is cut to the slots it leaves free, counted here,
--         so a dispatch round needs no round trip to count the leases first
-- The leases handed out are counted as 'dispatched' in counters:jobs (jobs.counters; with
-- redis.pcall: a metric never fails the dispatch).
-- Returns {{job, tenant, tier, order_key, attempt, expires_at, start_by ('' none)}, ...} in
-- dispatch order; a lease belongs to the attempt its entry was indexed with, and keeps its
-- meta (start_by included: a lease queued again from the reply keeps its deadline; the
-- lease costs no byte more than the queued entry did). Fails NOTLEADER, changing nothing,
-- when the token is not the leader's.
if fenced_out(ARGV[5]) then return redis.error_reply(NOT_LEADER) end
local n, now = tonumber(ARGV[1]), now_or_server(ARGV[2])
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  n = math.min(n, tonumber(ARGV[6]) - redis.call('ZCARD', LEASES))
  if n <= 0 then return {} end
end
local expires_at = now + tonumber(ARGV[3])

local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
for _, job in ipairs(due) do
  local m = meta_of(job)
  undelay(job, m[1])
  enqueue(job, m[1], m[3], false)
end

local out = {}
while #out < n do
  local top = redis.call('ZRANGE', RUNNABLE, 0, 0, 'WITHSCORES')
  local job = top[1]
  if not job then break end
  local m = meta_of(job)
  local tenant = m[1]
  local leases = lkey(tenant)
  local inflight, cap = redis.call('ZCARD', leases), cap_of(tenant)
  redis.call('ZREM', RUNNABLE, job)
  if inflight >= cap then
    redis.call('ZADD', BLOCKED, top[2], job)  -- found at its cap: blocked, not counted
  else
    local queue = qkey(tenant)
    redis.call('ZREM', queue, job)
    redis.call('ZREM', QUEUED, job)
    redis.call('ZREM', tkey(m[2]), job)
    if m[4] ~= '' then redis.call('ZREM', DEADLINES, job) end
    redis.call('ZADD', leases, expires_at, job)
    redis.call('ZADD', LEASES, expires_at, job)
    -- re-file the tenant under its next job (the refile of common.lua, its state known)
    local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
    if head[1] then
      redis.call('ZADD', inflight + 1 >= cap and BLOCKED or RUNNABLE, head[2], head[1])
    end
    out[#out + 1] = {job, tenant, m[2], m[3], attempt_of(m), string.format('%.17g', expires_at),
                     m[4] or ''}
  end
end
if #out > 0 then redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', 'dispatched', #out) end
return out
