-- restore_lease.lua: make an in-flight attempt (SQL says dispatched or running) hold its
-- lease until at least now + ttl: a rebuild or a reconciler round. An entry of a later
-- attempt is newer than the SQL read and is left alone; an entry of an earlier attempt, or a
-- queued entry of this one (SQL has it in flight), is stale and replaced; this attempt's
-- lease is extended, never shortened.
-- KEYS: the layout of common.lua, which is prepended (KEYS[13] the leader lock).
-- ARGV[1] job  ARGV[2] tenant  ARGV[3] tier  ARGV[4] order_key  ARGV[5] start_by ('' none)
-- ARGV[6] not_before ('' none)  ARGV[7] attempt  ARGV[8] ttl in seconds
-- ARGV[9] now ('' Redis's clock)  ARGV[10] the caller's fencing token ('' unfenced)
-- Returns 1 when the attempt holds a lease now, 0 when a newer entry was kept.
if fenced_out(ARGV[10]) then return redis.error_reply(NOT_LEADER) end
local job, tenant, tier, attempt = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[7])
local now = now_or_server(ARGV[9])
local expires_at = now + tonumber(ARGV[8])
local e = locate(job, tenant, tier)
if e then
  if e.attempt > attempt then return 0 end
  if e.attempt == attempt and e.state == 'leased' then
    local current = redis.call('ZSCORE', LEASES, job)
    if tonumber(current) < expires_at then
      redis.call('ZADD', LEASES, 'XX', expires_at, job)
      redis.call('ZADD', lkey(e.tenant), 'XX', expires_at, job)
    end
    return 1
  end
  unindex(job, e)  -- an earlier attempt's entry, or a stale queued entry of this one
end
redis.call('HSET', META, job, encode_meta(tenant, tier, ARGV[4], ARGV[5], ARGV[6], attempt))
redis.call('ZADD', lkey(tenant), expires_at, job)
redis.call('ZADD', LEASES, expires_at, job)
if tier_of_tenant(tenant) ~= tier then  -- its cap may have changed
  redis.call('HSET', TENANT_TIER, tenant, tier)
  TENANT_TIERS[tenant], CAPS[tenant] = tier, nil
end
local head = head_of(tenant)
if head then refile(tenant, head) end
return 1
