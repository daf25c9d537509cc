-- common.lua: the prelude of every index script (prepended to each when it is loaded).
-- KEYS[1] prefix (one hash tag; a tenant's and a tier's keys are derived from it)
-- KEYS[2] runnable_tenants  KEYS[3] blocked_tenants  KEYS[4] tier_delayed  KEYS[5] delayed
-- KEYS[6] deadlines  KEYS[7] leases  KEYS[8] meta  KEYS[9] tier_caps  KEYS[10] tenant_caps
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

-- Leases of a run's items after its first (fill_run.lua): each item keeps a lease of its own
-- (renewed, released and reaped as any), but the run holds one slot of the pool, so the pool
-- does not count them (a set of job ids, each also in LEASES). A rider is in its tenant's
-- lease set only when it is the first of its tenant's items in the run: a tenant's items in
-- one run hold one of its cap.
local RIDERS = PREFIX .. 'riders'

-- The index is whole while its generation sentinel is there (set by a leader's rebuild): one
-- that lost its data (a flush, a restart without it) has lost the leases of running jobs
-- too, so only the leader, once it has put them back, may lease again. The unfenced fast
-- paths (offer.lua, hand_over.lua) lease nothing until then; they ring the dispatcher.
local function whole() return redis.call('EXISTS', PREFIX .. 'generation') == 1 end

-- The pool is routed by kind while this flag is set (jobs.index.worker_registry): not every
-- live worker runs every kind, so only the dispatcher, which reads the kinds of what it
-- leases, may lease; the unfenced fast paths (offer.lua, hand_over.lua) lease nothing and
-- ring it. Jobs of a kind no live worker runs are parked (put_back.lua): delayed, each id
-- also in the set parked:<kind>, the kind in the set kinds_waiting.
local function routed() return redis.call('EXISTS', PREFIX .. 'routed') == 1 end

local function qkey(tenant) return PREFIX .. 'queue:' .. tenant end
local function lkey(tenant) return PREFIX .. 'lease:' .. tenant end
local function tkey(tier) return PREFIX .. 'tier:' .. tier end

-- A queued job's id is stored twice: in its tier's zset (tkey: the tier's queued jobs by order
-- key, the one place its order key is kept) and in its tenant's queue (qkey: a list of ids in
-- dispatch order, head first). A queued job has a meta entry only when it carries more than
-- those say (an attempt after the first, a start_by): an id with none is a queued job of
-- attempt 1, whose tenant only its caller can name (the queue it is in). There is no queue of
-- every tier: TIER_DELAYED counts each tier's delayed jobs, and its fields name every tier
-- that ever held a job (a position is the sum over them).
-- RUNNABLE and BLOCKED file each tenant with queued work under its head job, as the member
-- job .. '\0' .. tenant (ties go by job id, as positions do) scored by the head's order key.
local function filed(job, tenant) return job .. '\0' .. tenant end
local function unfiled(member)
  local at = string.find(member, '\0', 1, true)
  return string.sub(member, 1, at - 1), string.sub(member, at + 1)
end

-- The tiers a position sums over (TIER_DELAYED's fields), read once per call; a call that
-- names a new tier (note_tier) reads them again.
local TIERS = nil
local function tiers()
  if not TIERS then TIERS = redis.call('HKEYS', TIER_DELAYED) end
  return TIERS
end
local function note_tier(tier)
  if redis.call('HSETNX', TIER_DELAYED, tier, 0) == 1 then TIERS = nil end
end

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
  for _, tier in ipairs(tiers()) do
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
  for _, tier in ipairs(tiers()) do
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

-- The leases that hold a slot of the pool: every lease but those kept while ending and a
-- run's riders.
local function held_slots()
  return redis.call('ZCARD', LEASES) - redis.call('SCARD', ENDING) - redis.call('SCARD', RIDERS)
end

local function at_cap(tenant)
  return redis.call('ZCARD', lkey(tenant)) >= cap_of(tenant)
end

-- {tenant, tier, order_key, start_by, not_before, attempt[, cancel]} ('' for none), or nil
-- when the job has no meta entry (unknown, or a queued job of attempt 1 with no start_by).
-- The attempt is the one the entry (queued job or lease) belongs to; cancel is 1 once a
-- cancel was requested for the leased attempt (flag_cancel.lua).
local function meta_of(job)
  local raw = redis.call('HGET', META, job)
  if not raw then return nil end
  return cjson.decode(raw)
end

local function attempt_of(m) return tonumber(m[6]) or 1 end

local function encode_meta(tenant, tier, order_key, start_by, not_before, attempt)
  return cjson.encode({tenant, tier, order_key, start_by, not_before, tonumber(attempt)})
end

local TENANT_TIERS = {}  -- tenants' tiers read during this call
local function tier_of_tenant(tenant)
  local tier = TENANT_TIERS[tenant]
  if tier == nil then
    tier = redis.call('HGET', TENANT_TIER, tenant)
    TENANT_TIERS[tenant] = tier
  end
  return tier or nil
end

-- The tier whose zset holds job queued, and its order key (a string), or nil. tier: the
-- job's, when the caller knows it: read first.
local function queued_in(job, tier)
  if tier then
    local score = redis.call('ZSCORE', tkey(tier), job)
    if score then return tier, score end
  end
  for _, other in ipairs(tiers()) do
    if other ~= tier then
      local score = redis.call('ZSCORE', tkey(other), job)
      if score then return other, score end
    end
  end
  return nil, nil
end

-- The order key (a string) of a job in tenant's queue: its tier's zset holds it, the
-- tenant's own tier's first.
local function key_in_queue(job, tenant)
  local _, score = queued_in(job, tier_of_tenant(tenant))
  return score
end

-- (k1, j1) before (k2, j2) in dispatch order: order keys (numbers), ties by id.
local function ahead_of(k1, j1, k2, j2)
  if k1 ~= k2 then return k1 < k2 end
  return member_before(j1, j2)
end

local function head_of(tenant)
  return redis.call('LINDEX', qkey(tenant), 0) or nil
end

-- The tenant's head job and its order key (a string), or nil. An id no tier's zset holds
-- (which no script leaves behind) is dropped from the head rather than filed without a key.
local function head_and_key(tenant)
  while true do
    local head = head_of(tenant)
    if head == nil then return nil, nil end
    local key = key_in_queue(head, tenant)
    if key then return head, key end
    redis.call('LPOP', qkey(tenant))
  end
end

-- File a tenant under its head job: in blocked at its cap, else in runnable; out of both
-- when it has no queued work. old: the job it was filed under before the change (nil when it
-- had no queued work). True when it moved from blocked to runnable.
local function refile(tenant, old)
  local head, key = head_and_key(tenant)
  local was_blocked, member = false, old and filed(old, tenant)
  if old then was_blocked = redis.call('ZSCORE', BLOCKED, member) ~= false end
  local from = was_blocked and BLOCKED or RUNNABLE
  if head == nil then
    if old then redis.call('ZREM', from, member) end
    return false
  end
  local to_blocked = at_cap(tenant)
  if old == head and was_blocked == to_blocked then return false end
  if old then redis.call('ZREM', from, member) end
  redis.call('ZADD', to_blocked and BLOCKED or RUNNABLE, key, filed(head, tenant))
  return was_blocked and not to_blocked
end

-- Queued jobs at or below order_key that tenants below their caps can start on free slots
-- (each runnable tenant's jobs there, up to what its cap leaves), but for job exclude ('' or
-- nil: none); counted to at most limit, walking at most limit tenants. Jobs of tenants at
-- their cap take no free slot: they start only as their own tenants' slots free.
local function runnable_ahead(order_key, limit, exclude)
  if limit <= 0 then return 0 end
  local count, upto = 0, tonumber(order_key)
  local heads = redis.call('ZRANGEBYSCORE', RUNNABLE, '-inf', order_key, 'LIMIT', 0, limit)
  for _, member in ipairs(heads) do
    local _, tenant = unfiled(member)
    -- What this tenant can add: its cap's room, and no more than the count still lacks.
    local room = math.min(cap_of(tenant) - redis.call('ZCARD', lkey(tenant)), limit - count)
    if room > 0 then
      local ahead = 0  -- the tenant's jobs at or below order_key, to room (its first room + 1)
      for _, job in ipairs(redis.call('LRANGE', qkey(tenant), 0, room)) do
        if job ~= exclude then
          if (tonumber(key_in_queue(job, tenant)) or -math.huge) > upto then break end
          ahead = ahead + 1
        end
      end
      count = count + math.min(ahead, room)
      if count >= limit then return limit end
    end
  end
  return count
end

-- Put job (order key: a number) in its place in tenant's queue. Most arrive after the last
-- one: one look at the tail. Otherwise the place is searched from the tail (doubling steps,
-- then halving), and the job goes in by LINSERT, which finds its place from the head in
-- Redis's own loop (some 25 ns an entry): a retry (an early key) near the head, a tenant's
-- first jobs in a tier of higher priority anywhere. Only a place within a sixty-fourth of
-- that distance from the tail (a late submit of a concurrent pair) is reached from the
-- tail instead, the entries behind it taken off and put back, two calls from Lua each
-- (some 1.8 µs an entry).
local function insert(tenant, job, key)
  local queue = qkey(tenant)
  local n = redis.call('LLEN', queue)
  local function goes_before(i)
    local other = redis.call('LINDEX', queue, i)
    return ahead_of(key, job, tonumber(key_in_queue(other, tenant)) or -math.huge, other)
  end
  if n == 0 or not goes_before(n - 1) then
    redis.call('RPUSH', queue, job)
    return
  end
  local lo, hi, step = 0, n - 1, 1  -- it goes before the entry at hi, after those below lo
  while hi - step >= 0 do
    if not goes_before(hi - step) then
      lo = hi - step + 1
      break
    end
    hi, step = hi - step, step * 2
  end
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if goes_before(mid) then hi = mid else lo = mid + 1 end
  end
  if lo == 0 then
    redis.call('LPUSH', queue, job)
  elseif lo <= 64 * (n - lo) then
    redis.call('LINSERT', queue, 'BEFORE', redis.call('LINDEX', queue, lo), job)
  else
    local after = {}  -- the entries behind its place come off, and go back behind it
    for i = 1, n - lo do after[i] = redis.call('RPOP', queue) end
    redis.call('RPUSH', queue, job)
    for i = #after, 1, -1 do redis.call('RPUSH', queue, after[i]) end
  end
end

-- Take job (order key: a number) out of tenant's queue, searched from the nearer end.
local function dequeue(tenant, job, key)
  local queue = qkey(tenant)
  local n = redis.call('LLEN', queue)
  if n == 0 then return 0 end
  local middle = redis.call('LINDEX', queue, math.floor(n / 2))
  local from_tail = ahead_of(tonumber(key_in_queue(middle, tenant)) or -math.huge, middle,
                             key, job)
  return redis.call('LREM', queue, from_tail and -1 or 1, job)
end

-- Add a job to its tenant's queue and its tier's; re-file the tenant when its head changed,
-- or when its cap may have changed (recheck).
local function enqueue(job, tenant, tier, order_key, recheck)
  local old = head_of(tenant)
  redis.call('ZADD', tkey(tier), order_key, job)
  insert(tenant, job, tonumber(order_key))
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
  return redis.call('LLEN', qkey(tenant)) + delayed
end

-- File tenant under tier, the tier of its latest job; true when that changed it (a new
-- tenant, or one that changed tier: its cap may have changed, the caller refiles it).
local function retier(tenant, tier)
  if tier_of_tenant(tenant) == tier then return false end
  redis.call('HSET', TENANT_TIER, tenant, tier)
  TENANT_TIERS[tenant], CAPS[tenant] = tier, nil
  return true
end

-- Index a job: queued, or delayed when it has a not_before ('' for none). Its meta entry is
-- written unless it is queued at attempt 1 with no start_by: the bytes of a queued job are
-- its id in two places, nothing more.
local function index_job(job, tenant, tier, order_key, start_by, not_before, attempt)
  if start_by ~= '' or not_before ~= '' or tonumber(attempt) ~= 1 then
    redis.call('HSET', META, job, encode_meta(tenant, tier, order_key, start_by, not_before,
                                              attempt))
  end
  local retiered = retier(tenant, tier)
  note_tier(tier)  -- the tier is named among those to count
  if start_by ~= '' then redis.call('ZADD', DEADLINES, start_by, job) end
  if not_before == '' then
    enqueue(job, tenant, tier, order_key, retiered)
    return
  end
  redis.call('ZADD', DELAYED, not_before, job)
  redis.call('HINCRBY', TENANT_DELAYED, tenant, 1)
  redis.call('HINCRBY', TIER_DELAYED, tier, 1)
  local head = head_of(tenant)
  if retiered and head then refile(tenant, head) end
end

-- Where the index holds job: {state ('queued', 'delayed', 'leased', or 'none' for a stray
-- meta entry), tenant, tier, order_key, start_by, not_before, attempt, meta}, or nil when it
-- does not. tenant, tier: the job's, when the caller knows them. A queued job without meta is
-- found in its tier's zset (tier is read first), and its tenant is the caller's word (nil
-- when the caller cannot name it: unindex then searches the queues for it).
local function locate(job, tenant, tier)
  local m = meta_of(job)
  if m then
    local state = 'none'
    if redis.call('ZSCORE', LEASES, job) then
      state = 'leased'
    elseif redis.call('ZSCORE', DELAYED, job) then
      state = 'delayed'
    elseif redis.call('ZSCORE', tkey(m[2]), job) then
      state = 'queued'
    end
    return {state = state, tenant = m[1], tier = m[2], order_key = m[3],
            start_by = m[4] or '', not_before = m[5] or '', attempt = attempt_of(m), meta = m}
  end
  local found, score = queued_in(job, tier)
  if not found then return nil end
  return {state = 'queued', tenant = tenant, tier = found, order_key = score, start_by = '',
          not_before = '', attempt = 1}
end

-- The tenant whose queue holds job, for a queued job without meta whose caller cannot name
-- its tenant (a stray entry of a submit that never committed): a walk of every queue of its
-- tier's tenants, maintenance only.
local function find_tenant(job, tier)
  local tenants = redis.call('HGETALL', TENANT_TIER)
  for i = 1, #tenants, 2 do
    if tenants[i + 1] == tier and redis.call('LPOS', qkey(tenants[i]), job) then
      return tenants[i]
    end
  end
  for i = 1, #tenants, 2 do  -- a tenant that changed tier since
    if tenants[i + 1] ~= tier and redis.call('LPOS', qkey(tenants[i]), job) then
      return tenants[i]
    end
  end
  return nil
end

-- Remove every trace of a job the index holds (e: locate's answer) and re-file its tenant.
-- Returns what it was: 'queued', 'delayed', 'leased' (or 'none' for a stray meta entry).
local function unindex(job, e)
  local tenant, state, old = e.tenant, e.state, nil
  if state == 'delayed' then
    undelay(job, tenant, e.tier)
  elseif state == 'queued' then
    local removed = 0
    if tenant then
      old = head_of(tenant)
      removed = dequeue(tenant, job, tonumber(e.order_key))
    end
    if removed == 0 then  -- no tenant named, or not the one whose queue holds it
      tenant = find_tenant(job, e.tier)
      if tenant then
        old = head_of(tenant)
        dequeue(tenant, job, tonumber(e.order_key))
      end
    end
    redis.call('ZREM', tkey(e.tier), job)
  elseif state == 'leased' then
    redis.call('ZREM', LEASES, job)
    redis.call('ZREM', lkey(tenant), job)
    redis.call('SREM', ENDING, job)
    redis.call('SREM', RIDERS, job)
  end
  redis.call('ZREM', DEADLINES, job)
  redis.call('HDEL', META, job)
  if state == 'queued' and tenant then
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
-- a lease has a meta entry (start_by included), written here for a job queued without one.
local function lease_next(n, expires_at)
  local out = {}
  while #out < n do
    local top = redis.call('ZRANGE', RUNNABLE, 0, 0, 'WITHSCORES')
    local member = top[1]
    if not member then break end
    local job, tenant = unfiled(member)
    local leases = lkey(tenant)
    local inflight, cap = redis.call('ZCARD', leases), cap_of(tenant)
    redis.call('ZREM', RUNNABLE, member)
    if inflight >= cap then
      redis.call('ZADD', BLOCKED, top[2], member)  -- found at its cap: blocked, not counted
    else
      local queue = qkey(tenant)
      redis.call('LPOP', queue)  -- job: the tenant is filed under its head
      local m = meta_of(job)
      local tier, order_key, start_by, attempt
      if m then
        tier, order_key, start_by, attempt = m[2], m[3], m[4] or '', attempt_of(m)
        if start_by ~= '' then redis.call('ZREM', DEADLINES, job) end
      else
        tier, order_key, start_by, attempt = tier_of_tenant(tenant), top[2], '', 1
        tier = queued_in(job, tier)
        if tier then redis.call('HSET', META, job, encode_meta(tenant, tier, order_key, '', '', 1)) end
      end
      if tier then  -- (none: an id its tier's zset lost, dropped from the queue here)
        redis.call('ZREM', tkey(tier), job)
        redis.call('ZADD', leases, expires_at, job)
        redis.call('ZADD', LEASES, expires_at, job)
        out[#out + 1] = {job, tenant, tier, order_key, attempt,
                         string.format('%.17g', expires_at), start_by}
        inflight = inflight + 1
      end
      -- re-file the tenant under its next job (the refile above, its state known)
      local head, key = head_and_key(tenant)
      if head then
        redis.call('ZADD', inflight >= cap and BLOCKED or RUNNABLE, key, filed(head, tenant))
      end
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
  redis.call('SREM', RIDERS, job)
  redis.call('HDEL', META, job)
  local head = head_of(tenant)
  return true, (head ~= nil and refile(tenant, head))
end
