-- upgrade_layout.lua: bring an index an earlier version wrote to this layout, at the start of
-- a leader's full pass; called until it says there is no more to do.
-- KEYS: the layout of common.lua, which is prepended (KEYS[13] the leader lock).
-- ARGV[1] the caller's fencing token ('' unfenced)  ARGV[2] the jobs to move in one call (at
--         least one tenant's queue is moved whole)
-- Returns {upgraded 0/1, more 0/1}: whether this call changed anything, and whether there is
-- more to do. Fails NOTLEADER, changing nothing, when the token is not the leader's.
--
-- Two earlier layouts, each found by a key only it had:
-- 1. `queued`, a zset of every tier's queued jobs, and a tier's delayed jobs in the tier's
--    zset: the first goes (unlinked, freed in the background) and each delayed job leaves its
--    tier's zset and is counted in tier_delayed instead. O(delayed jobs).
-- 2. `runnable` and `blocked` (tenants filed under their head job alone) and a tenant's queue
--    as the zset `q:<tenant>`: each such queue becomes the list queue:<tenant> (merged with
--    one a process of this version started meanwhile), its tenant is filed in this layout's
--    runnable_tenants or blocked_tenants, and the old keys go. Every job of the old layout
--    has meta, which it keeps (a queued job may have meta). O(queued jobs), in calls of about
--    ARGV[2] jobs, so that no call holds Redis for long.
if fenced_out(ARGV[1]) then return redis.error_reply(NOT_LEADER) end
local upgraded = 0

local old = PREFIX .. 'queued'
if redis.call('EXISTS', old) == 1 then
  upgraded = 1
  redis.call('UNLINK', old)
  for _, tier in ipairs(redis.call('HKEYS', TIER_CAPS)) do note_tier(tier) end
  for _, tier in ipairs(redis.call('HVALS', TENANT_TIER)) do note_tier(tier) end
  for _, job in ipairs(redis.call('ZRANGE', DELAYED, 0, -1)) do
    local m = meta_of(job)
    if m and redis.call('ZREM', tkey(m[2]), job) == 1 then
      redis.call('HINCRBY', TIER_DELAYED, m[2], 1)
    end
  end
end

-- A tenant's old queue, merged into its list in dispatch order.
local function move_queue(tenant)
  local from = PREFIX .. 'q:' .. tenant
  local jobs = redis.call('ZRANGE', from, 0, -1, 'WITHSCORES')
  local merged, head = {}, head_of(tenant)
  local listed = redis.call('LRANGE', qkey(tenant), 0, -1)
  local i, j = 1, 1
  while i <= #jobs or j <= #listed do
    local take_old = j > #listed
    if i <= #jobs and not take_old then
      local key = tonumber(key_in_queue(listed[j], tenant)) or -math.huge
      take_old = ahead_of(tonumber(jobs[i + 1]), jobs[i], key, listed[j])
    end
    if take_old then
      merged[#merged + 1] = jobs[i]
      i = i + 2
    else
      merged[#merged + 1] = listed[j]
      j = j + 1
    end
  end
  redis.call('DEL', qkey(tenant))
  for k = 1, #merged, 1000 do
    redis.call('RPUSH', qkey(tenant), unpack(merged, k, math.min(k + 999, #merged)))
  end
  redis.call('DEL', from)
  refile(tenant, head)
  return #jobs / 2
end

local budget = tonumber(ARGV[2])
for _, name in ipairs({'runnable', 'blocked'}) do
  local filed_old = PREFIX .. name
  while budget > 0 do
    local top = redis.call('ZRANGE', filed_old, 0, 0)[1]
    if not top then break end
    upgraded = 1
    local m = meta_of(top)
    redis.call('ZREM', filed_old, top)
    if m then budget = budget - move_queue(m[1]) end
  end
end
local more = 0
if redis.call('EXISTS', PREFIX .. 'runnable', PREFIX .. 'blocked') > 0 then more = 1 end
return {upgraded, more}
