-- fill_run.lua: fill the run a slot's first item leads (jobs.core.packing): lease, in the
-- pool's order (order key, ties by id), the queued candidates (jobs of the lead's kind, named
-- by the caller from SQL) that may run now, until the run holds max_items items or the
-- budget would be passed. The lead was leased as any job is (dispatch.lua, offer.lua,
-- hand_over.lua: packing never changes which job a slot starts first); its riders hold no
-- slot (common.lua's RIDERS). A candidate's tenant that has an item in the run already adds
-- it without counting against its cap; another tenant must be below its cap, and its first
-- item then holds one of it.
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1] the lead job  ARGV[2] its attempt (its lease must be held: else nothing is leased)
-- ARGV[3] lease ttl in seconds  ARGV[4] now ('' Redis's clock)  ARGV[5] max_items
-- ARGV[6] max_cost ('' no budget)  ARGV[7] the lead's cost
-- ARGV[8..] the candidates, three arguments each: job, tenant, cost
-- Returns {{job, tenant, tier, order_key, attempt, expires_at, start_by ('' none)}, ...} in
-- run order; each counted 'dispatched' in counters:jobs.
local lead = ARGV[1]
if not redis.call('ZSCORE', LEASES, lead) then return {} end
local lm = meta_of(lead)
if not lm or attempt_of(lm) ~= tonumber(ARGV[2]) then return {} end
local expires_at = now_or_server(ARGV[4]) + tonumber(ARGV[3])
local max_items, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
local cost = tonumber(ARGV[7]) or 0
local in_run = {[lm[1]] = true}

local found = {}
for i = 8, #ARGV - 2, 3 do
  local job, tenant = ARGV[i], ARGV[i + 1]
  local e = locate(job, tenant, tier_of_tenant(tenant))
  if e and e.state == 'queued' and e.tenant == tenant then
    found[#found + 1] = {job = job, tenant = tenant, cost = tonumber(ARGV[i + 2]) or 0,
                         key = tonumber(e.order_key), e = e}
  end
end
table.sort(found, function(a, b) return ahead_of(a.key, a.job, b.key, b.job) end)

local out = {}
for _, f in ipairs(found) do
  if #out + 1 >= max_items then break end
  if budget and cost + f.cost > budget then break end
  local tenant, e = f.tenant, f.e
  local seat = not in_run[tenant]
  local old = (not (seat and at_cap(tenant))) and head_of(tenant)
  -- (a tenant's queue that does not hold the job: the caller named another tenant; skipped)
  if old and dequeue(tenant, f.job, f.key) > 0 then
    redis.call('ZREM', tkey(e.tier), f.job)
    if e.start_by ~= '' then redis.call('ZREM', DEADLINES, f.job) end
    redis.call('HSET', META, f.job,
               encode_meta(tenant, e.tier, e.order_key, e.start_by, '', e.attempt))
    redis.call('ZADD', LEASES, expires_at, f.job)
    redis.call('SADD', RIDERS, f.job)
    if seat then
      redis.call('ZADD', lkey(tenant), expires_at, f.job)
      in_run[tenant] = true
    end
    refile(tenant, old)
    cost = cost + f.cost
    out[#out + 1] = {f.job, tenant, e.tier, e.order_key, e.attempt,
                     string.format('%.17g', expires_at), e.start_by}
  end
end
if #out > 0 then redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', 'dispatched', #out) end
return out
