-- common.lua: the prelude of every index script (prepended to each when it is loaded).
-- KEYS[1] prefix (one hash tag; a tenant's and a tier's keys are derived from it)
-- KEYS[2] runnable  KEYS[3] blocked  KEYS[4] tier_delayed  KEYS[5] delayed  KEYS[6] deadlines
-- KEYS[7] leases  KEYS[8] meta  KEYS[9] tier_caps  KEYS[10] tenant_caps
-- KEYS[11] tenant_tier  KEYS[12] tenant_delayed  KEYS[13] leader (the fence of leader writes)
-- Scores travel as strings (Python's repr of a float) so they round-trip exactly.
-- Time: every script that needs "now" reads Redis's own clock (TIME) unless the caller passes
-- one explicitly (tests and the simulator drive a virtual clock); hosts' clocks never decide.
local PREFIX, RUNNABLE, BLOCKED, TIER_DELAYED = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local DELAYED, DEADLINES, LEASES, META = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local TIER_CAPS, TENANT_CAPS, TENANT_TIER, TENANT_DELAYED = KEYS[9], KEYS[10], KEYS[11], KEYS[12]

-- Leases kept by a slot that passed itself on before its ending's commit (hand_over.lua,
-- keep): held until released, but their slot is the next job's, so the pool does not count
-- them (a set of job ids, each also in LEASES).
local ENDING = PREFIX .. 'ending'

-- The index is whole while its generation sentinel is there (set by a leader's rebuild): one
-- that lost its data (a flush, a restart without it) has lost the leases of running jobs
-- too, so only the leader, once it has put them back, may lease again. The unfenced fast
-- paths (offer.lua, hand_over.lua) lease nothing until then; they ring the dispatcher.
local function whole() return redis.call('EXISTS', PREFIX .. 'generation') == 1 end

local function qkey(tenant) return PREFIX .. 'q:' .. tenant end
local function lkey(tenant) return PREFIX .. 'lease:' .. tenant end
local function tkey(tier) return PREFIX .. 'tier:' .. tier end

-- A job's id is stored once per structure it is in, and a queued job is in its tenant's
-- queue and its tier's (tkey: the tier's queued jobs, by order key); there is no queue of
-- every tier. TIER_DELAYED counts each tier's delayed jobs, and its fields name every tier
-- that ever held a job: a position is the sum over them.

-- a < b as a sorted set orders members of equal score (byte by byte, as memcmp): Lua's own
-- string order follows the server's locale.
local function member_before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Queued jobs ahead of (score, job) in order-key order, ties by id: the position a queued
-- job has, or would have if queued (score: its order key as a string, exactly).
local function rank_of(score, job)
  local n = 0
  for _, tier in ipairs(redis.call('HKEYS', TIER_DELAYED)) do
    local queue = tkey(tier)
    n = n + redis.call('ZCOUNT', queue, '-inf', '(' .. score)
    for _, other in ipairs(redis.call('ZRANGEBYSCORE', queue, score, score)) do
      if member_before(other, job) then n = n + 1 end
    end
  end
  return n
end

-- Queued jobs with an order key at or below score (ZCOUNT -inf score over every tier).
local function count_upto(score)
  local n = 0
  for _, tier in ipairs(redis.call('HKEYS', TIER_DELAYED)) do
    n = n + redis.call('ZCOUNT', tkey(tier), '-inf', score)
  end
  return n
end

-- A tier's waiting jobs: queued and delayed.
local function tier_waiting(tier)
  return redis.call('ZCARD', tkey(tier)) + (tonumber(redis.call('HGET', TIER_DELAYED, tier)) or 0)
end

-- The dispatcher's doorbell (jobs.wake): one pending token is as good as many.
local function ring()
  local bell = PREFIX .. 'wake'
  redis.call('LPUSH', bell, '1')
  redis.call('LTRIM', bell, 0, 0)
end

-- Redis's clock, in seconds since the epoch (frozen for the duration of the script).
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- The time a caller passed ('' or nil: Redis's clock).
local function now_or_server(arg)
  if arg == nil or arg == '' then return server_now() end
  return tonumber(arg)
end

local CAPS, TIER_CAP = {}, {}  -- caps looked up during this call (tenant, tier)

local function cap_of(tenant)
  local cap = CAPS[tenant]
  if cap then return cap end
  cap = tonumber(redis.call('HGET', TENANT_CAPS, tenant))
  if not cap then
    local tier = redis.call('HGET', TENANT_TIER, tenant)
    if tier then
      cap = TIER_CAP[tier]
      if not cap then
        cap = tonumber(redis.call('HGET', TIER_CAPS, tier)) or 1
        TIER_CAP[tier] = cap
      end
    end
  end
  cap = cap or 1
  CAPS[tenant] = cap
  return cap
end

-- The leases that hold a slot of the pool: every lease but those kept while ending.
local function held_slots()
  return redis.call('ZCARD', LEASES) - redis.call('SCARD', ENDING)
end

local function at_cap(tenant)
  return redis.call('ZCARD', lkey(tenant)) >= cap_of(tenant)
end

-- {tenant, tier, order_key, start_by, not_before, attempt[, cancel]} ('' for none), or nil
-- when unknown. The attempt is the one the entry (queued job or lease) belongs to; cancel is 1
-- once a cancel was requested for the leased attempt (flag_cancel.lua).
local function meta_of(job)
  local raw = redis.call('HGET', META, job)
  if not raw then return nil end
  return cjson.decode(raw)
end

local function attempt_of(m) return tonumber(m[6]) or 1 end

local function encode_meta(tenant, tier, order_key, start_by, not_before, attempt)
  return cjson.encode({tenant, tier, order_key, start_by, not_before, tonumber(attempt)})
end

local function head_of(tenant)
  return redis.call('ZRANGE', qkey(tenant), 0, 0)[1]
end

-- File a tenant under its head job: in blocked at its cap, else in runnable; out of both
-- when it has no queued work. old: the member it was filed under before the change (nil
-- when it had no queued work). True when it moved from blocked to runnable.
local function refile(tenant, old)
  local head = redis.call('ZRANGE', qkey(tenant), 0, 0, 'WITHSCORES')
  local was_blocked = false
  if old then was_blocked = redis.call('ZSCORE', BLOCKED, old) ~= false end
  local from = was_blocked and BLOCKED or RUNNABLE
  if head[1] == nil then
    if old then redis.call('ZREM', from, old) end
    return false
  end
  local to_blocked = at_cap(tenant)
  if old == head[1] and was_blocked == to_blocked then return false end
  if old then redis.call('ZREM', from, old) end
  redis.call('ZADD', to_blocked and BLOCKED or RUNNABLE, head[2], head[1])
  return was_blocked and not to_blocked
end

-- Queued jobs at or below order_key that tenants below their caps can start on free slots
-- (each runnable tenant's jobs there, up to what its cap leaves), but for job exclude ('' or
-- nil: none); counted to at most limit, walking at most limit tenants. Jobs of tenants at
-- their cap take no free slot: they start only as their own tenants' slots free.
local function runnable_ahead(order_key, limit, exclude)
  if limit <= 0 then return 0 end
  local count = 0
  local heads = redis.call('ZRANGEBYSCORE', RUNNABLE, '-inf', order_key, 'LIMIT', 0, limit)
  for _, head in ipairs(heads) do
    local m = meta_of(head)
    if m then
      local tenant = m[1]
      local queue = qkey(tenant)
      local ahead = redis.call('ZCOUNT', queue, '-inf', order_key)
      if exclude and exclude ~= '' and redis.call('ZSCORE', queue, exclude) then
        ahead = ahead - 1
      end
      local room = cap_of(tenant) - redis.call('ZCARD', lkey(tenant))
      count = count + math.max(0, math.min(ahead, room))
      if count >= limit then return limit end
    end
  end
  return count
end

-- Add a job to its tenant's queue; re-file the tenant when its head changed, or when its
-- cap may have changed (recheck).
local function enqueue(job, tenant, tier, order_key, recheck)
  local old = head_of(tenant)
  redis.call('ZADD', qkey(tenant), order_key, job)
  redis.call('ZADD', tkey(tier), order_key, job)
  if recheck or head_of(tenant) ~= old then refile(tenant, old) end
end

local function undelay(job, tenant, tier)
  if redis.call('ZREM', DELAYED, job) == 0 then return false end
  if redis.call('HINCRBY', TENANT_DELAYED, tenant, -1) <= 0 then
    redis.call('HDEL', TENANT_DELAYED, tenant)
  end
  redis.call('HINCRBY', TIER_DELAYED, tier, -1)
  return true
end

local function tenant_queued(tenant)
  local delayed = tonumber(redis.call('HGET', TENANT_DELAYED, tenant)) or 0
  return redis.call('ZCARD', qkey(tenant)) + delayed
end

-- Index a job: queued, or delayed when it has a not_before ('' for none).
local function index_job(job, tenant, tier, order_key, start_by, not_before, attempt)
  redis.call('HSET', META, job, encode_meta(tenant, tier, order_key, start_by, not_before,
                                            attempt))
  local retiered = redis.call('HGET', TENANT_TIER, tenant) ~= tier
  if retiered then  -- a new tenant, or one that changed tier: its cap may have changed
    redis.call('HSET', TENANT_TIER, tenant, tier)
    CAPS[tenant] = nil
  end
  if start_by ~= '' then redis.call('ZADD', DEADLINES, start_by, job) end
  if not_before == '' then
    redis.call('HSETNX', TIER_DELAYED, tier, 0)  -- the tier is named among those to count
    enqueue(job, tenant, tier, order_key, retiered)
    return
  end
  redis.call('ZADD', DELAYED, not_before, job)
  redis.call('HINCRBY', TENANT_DELAYED, tenant, 1)
  redis.call('HINCRBY', TIER_DELAYED, tier, 1)
  local head = head_of(tenant)
  if retiered and head then refile(tenant, head) end
end

-- Remove every trace of a job the index knows (m: its meta) and re-file its tenant.
-- Returns what it was: 'queued', 'delayed', 'leased' (or 'none' for a stray meta entry).
local function unindex(job, m)
  local tenant, state, old = m[1], 'none', nil
  if undelay(job, tenant, m[2]) then
    state = 'delayed'
  elseif redis.call('ZSCORE', qkey(tenant), job) then
    state, old = 'queued', head_of(tenant)
    redis.call('ZREM', qkey(tenant), job)
    redis.call('ZREM', tkey(m[2]), job)
  elseif redis.call('ZREM', LEASES, job) == 1 then
    state = 'leased'
    redis.call('ZREM', lkey(tenant), job)
    redis.call('SREM', ENDING, job)
  end
  redis.call('ZREM', DEADLINES, job)
  redis.call('HDEL', META, job)
  if state == 'queued' then
    refile(tenant, old)
  elseif state == 'leased' then
    local head = head_of(tenant)
    if head then refile(tenant, head) end
  end
  return state
end

-- The fence of every write a leader makes (dispatch, reap, expire_due, caps, requeue and
-- release of a rebuild or a reconciler round, the batch feeder's admit): true when the
-- caller's fencing token (ARGV; '' for an unfenced call) is not the lock's value, i.e. the
-- caller is not the leader (any more) and must change nothing.
local NOT_LEADER = 'NOTLEADER the fencing token is not the leader\'s'
local function fenced_out(token)
  if token == nil or token == '' then return false end
  return redis.call('GET', KEYS[13]) ~= token
end

-- Move delayed jobs whose not_before has come into their queues (at most limit, oldest first).
local function promote_due(now, limit)
  local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, limit)
  for _, job in ipairs(due) do
    local m = meta_of(job)
    undelay(job, m[1], m[2])
    enqueue(job, m[1], m[2], m[3], false)
  end
end

-- Lease up to n jobs in order-key order across runnable tenants, each until expires_at; a
-- tenant found at its cap moves to blocked (it does not count toward n). Returns
-- {{job, tenant, tier, order_key, attempt, expires_at, start_by ('' none)}, ...} in order;
-- a lease keeps its entry's meta (start_by included).
local function lease_next(n, expires_at)
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
      redis.call('ZREM', tkey(m[2]), job)
      if m[4] ~= '' then redis.call('ZREM', DEADLINES, job) end
      redis.call('ZADD', leases, expires_at, job)
      redis.call('ZADD', LEASES, expires_at, job)
      -- re-file the tenant under its next job (the refile above, its state known)
      local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
      if head[1] then
        redis.call('ZADD', inflight + 1 >= cap and BLOCKED or RUNNABLE, head[2], head[1])
      end
      out[#out + 1] = {job, tenant, m[2], m[3], attempt_of(m),
                       string.format('%.17g', expires_at), m[4] or ''}
    end
  end
  if #out > 0 then redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', 'dispatched', #out) end
  return out
end

-- Drop the lease of one attempt (attempt '' any) and re-file its tenant. Returns whether a
-- lease was dropped, and whether its tenant moved from blocked to runnable.
local function drop_lease(job, attempt)
  if not redis.call('ZSCORE', LEASES, job) then return false, false end
  local m = meta_of(job)
  if attempt ~= '' and attempt_of(m) ~= tonumber(attempt) then return false, false end
  local tenant = m[1]
  redis.call('ZREM', LEASES, job)
  redis.call('ZREM', lkey(tenant), job)
  redis.call('SREM', ENDING, job)
  redis.call('HDEL', META, job)
  local head = head_of(tenant)
  return true, (head ~= nil and refile(tenant, head))
end
