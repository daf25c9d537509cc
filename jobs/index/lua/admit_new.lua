-- admit_new.lua: admit a submitted job in one call: the tenant's request rate, the pool's
-- live figures, the bounds that follow from them, the tenant's own deadline and the admit.
-- KEYS: the layout of common.lua (prepended, then token_bucket.lua, workers.lua and
-- admit_job.lua), then KEYS[14] workers  KEYS[15] worker_slots  KEYS[16] service_mean
-- KEYS[17] the tenant's rate bucket  KEYS[18] the refusals of this minute (a hash).
-- ARGV[1] job  ARGV[2] tenant  ARGV[3] tier  ARGV[4] order_key  ARGV[5] start_by ('' none)
-- ARGV[6] now (the bucket's and the registrations' clock; '' Redis's)
-- ARGV[7] rate per second ('' no rate limit)  ARGV[8] burst
-- ARGV[9] pool concurrency ('' the live workers' slots)  ARGV[10] configured mean service
-- time  ARGV[11] samples a measured mean needs  ARGV[12] the tier's useful wait (bound)
-- ARGV[13] the tier's queued share (quota)  ARGV[14] the tier's tenant share (cap)
-- ARGV[15] the tenant's cap ('' the tier's)  ARGV[16] the tenant's quota ('' the tier's)
-- ARGV[17] the job's max_wait_s ('' none)  ARGV[18] seconds to keep KEYS[18]
-- ARGV[19] jobs (of the pool's mean service time) expected to arrive within max_wait_s and
-- pass it (policy.passing_jobs)
-- Returns {accepted 0/1, reason or '', tier_queued, tenant_queued, position, duplicate 0/1,
-- tenant_inflight, capacity, inflight, measured mean ('' none), measured samples ('' none),
-- seconds until the next token ('0'), bound, quota, max_position ('' none), starts_ahead}.
-- starts_ahead: the jobs ahead that start before it. When tenants below their caps leave it a
-- free slot (runnable_ahead), those; the job starts at once, and no max_wait_s refuses it.
-- Otherwise every job ahead (position).
--
-- The arithmetic is jobs/policy.py's (queue_bound, tenant_quota, tenant_cap, tenant_rate,
-- latest_useful_position, latest_useful_excess, service_rate.mean_service_s), step for step
-- in doubles; the index contract suite holds the two equal. Checks, in order: the rate
-- (refused: 'rate', at the position ZCOUNT gives), the tenant's own deadline (its jobs in
-- flight and queued under its cap: 'deadline', at the same position), then admit_job.
-- A job already indexed takes no token and is checked against nothing.
-- Counted (jobs.counters): a refusal in counters:rejections under 'tier|cause|limit', a new
-- job accepted as 'queued' in counters:jobs; a duplicate is neither. A refusal also adds one
-- to its tier's and its tenant's count of its reason in KEYS[18], one hash per minute (the
-- dashboard reads the last minutes). Counting uses pcall: a count never fails an admission.
local job, tenant, tier, order_key = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = now_or_server(ARGV[6])
local max_wait = tonumber(ARGV[17])
local duplicate = locate(job, tenant, tier) ~= nil

local function count_refusal(reason)
  redis.pcall('HINCRBY', KEYS[18], cjson.encode({'tier', tier, reason}), 1)
  redis.pcall('HINCRBY', KEYS[18], cjson.encode({'tenant', tenant, reason}), 1)
  redis.pcall('EXPIRE', KEYS[18], tonumber(ARGV[18]))
end

local REFUSED_AS = {rate = 'tenant_limit|rate', tenant_limit = 'tenant_limit|quota',
                    capacity = 'capacity|bound', deadline = 'capacity|deadline',
                    cap = 'tenant_limit|cap'}
local function count(accepted, reason, dup)
  if accepted == 1 then
    if dup == 0 then redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', 'queued', 1) end
  else
    redis.pcall('HINCRBY', PREFIX .. 'counters:rejections',
               tier .. '|' .. (REFUSED_AS[reason] or ('capacity|' .. reason)), 1)
    count_refusal(reason)
  end
end

local rate = tonumber(ARGV[7])
if rate and not duplicate then
  local allowed, wait = take_token(KEYS[17], rate, tonumber(ARGV[8]), now)
  if allowed == 0 then
    count(0, 'rate', 0)
    local ahead = count_upto(order_key)
    return {0, 'rate', 0, 0, ahead, 0, 0, 0, 0, '', '',
            string.format('%.17g', wait), 0, 0, '', ahead}
  end
end

-- The measured mean service time, as jobs.service_rate publishes and reads it.
local measured = redis.call('HMGET', KEYS[16], 'mean_s', 'samples')
local measured_mean, samples = tonumber(measured[1]), tonumber(measured[2])
if not measured_mean or not samples or measured_mean ~= measured_mean
    or measured_mean == math.huge or measured_mean < 0 then
  measured_mean, samples = nil, nil
end
local mean = tonumber(ARGV[10])
if measured_mean and samples >= tonumber(ARGV[11]) then mean = math.max(0.001, measured_mean) end

local capacity = tonumber(ARGV[9]) or live_slots(KEYS[14], KEYS[15], now)
local inflight = held_slots()
local mu = math.max(0, capacity) / mean
local bound = math.max(1, capacity, math.floor(mu * tonumber(ARGV[12]) + 1e-9))
local quota = tonumber(ARGV[16]) or math.max(1, math.floor(bound * tonumber(ARGV[13]) + 1e-9))
local cap = tonumber(ARGV[15]) or math.max(1, math.floor(capacity * tonumber(ARGV[14]) + 1e-9))
local tenant_inflight = redis.call('ZCARD', lkey(tenant))
local max_position = nil
if max_wait and mu > 0 then
  max_position = math.max(0, capacity - inflight) - 1
                 + math.max(0, math.floor(mu * max_wait - tonumber(ARGV[19]) + 1e-9))
end

local runnable = nil  -- runnable_ahead of a new job that finds a free slot, else nil
local function verdict(r)
  count(r[1], r[5], r[6])
  local measured_out = measured_mean and string.format('%.17g', measured_mean) or ''
  return {r[1], r[5], r[2], r[3], r[4], r[6], tenant_inflight, capacity, inflight,
          measured_out, samples or '', '0', bound, quota, max_position or '',
          runnable or r[4]}
end

if max_wait and not duplicate and capacity > 0 then
  local tenant_rate = math.min(math.max(1, cap), capacity) / mean
  local max_excess = math.floor(tenant_rate * max_wait + 1e-9)
  local ahead = tenant_queued(tenant)
  local excess = math.max(0, tenant_inflight + ahead - math.max(1, cap) + 1)
  if excess > max_excess then
    local tier_queued = tier_waiting(tier)
    return verdict({0, tier_queued, ahead, count_upto(order_key), 'deadline', 0})
  end
end

-- A tier at its bound while a slot of the pool is free: its queued jobs wait on their tenants'
-- caps, not on the pool. A job whose own tenant is at its cap is refused for that cap
-- ('cap', tenant_limit): the pool is not to blame. Any other job may take the free slot at
-- once, as long as more slots are free than tenants have a job runnable: it is let past the
-- bound (the bound counts jobs that wait, and this one will not).
-- Then whether the runnable jobs ahead leave it a free slot (runnable, above).
local admit_bound = bound
if not duplicate then
  local tier_queued = tier_waiting(tier)
  local free = math.max(0, capacity - inflight)
  if tier_queued >= bound and free > 0 then
    if tenant_inflight >= cap then
      return verdict({0, tier_queued, tenant_queued(tenant), count_upto(order_key), 'cap', 0})
    end
    if free > redis.call('ZCARD', RUNNABLE) then admit_bound = tier_queued + 1 end
  end
  local ahead = runnable_ahead(order_key, free, nil)
  if ahead < free then runnable = ahead end
end
return verdict(admit_job(job, tenant, tier, order_key, ARGV[5], '', admit_bound, quota,
                         runnable == nil and max_position or nil))
