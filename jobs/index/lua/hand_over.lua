-- hand_over.lua: a worker's slot passes from the attempt that just ended to the best runnable
-- job, in one step: release that attempt's lease (release.lua), then lease the next job if
-- the pool has a free slot (dispatch.lua's order, caps and count), so no dispatcher wake-up
-- sits between two jobs. Nothing leased (no runnable job, or no free slot): the doorbell
-- rings instead, and the dispatcher does what is left (a batch's feed, a full pool, an index
-- that lost its data and is not rebuilt yet: common.lua's whole; a pool routed by kind,
-- whose jobs only the dispatcher leases: common.lua's routed).
-- KEYS: the layout of common.lua (prepended, then workers.lua and push.lua), then KEYS[14] workers
-- KEYS[15] worker_slots  KEYS[16] the broker queue's list (with ARGV[10] only).
-- ARGV[1] job  ARGV[2] attempt  ARGV[3] '1': publish the job's id on 'changed' (jobs.notify)
-- ARGV[4] the status the job just moved to ('' none): counted in counters:jobs
-- ARGV[5] lease ttl in seconds  ARGV[6] now ('' Redis's clock)
-- ARGV[7] the pool's capacity ('' the live workers' slots)  ARGV[8] promote limit
-- ARGV[9] '1': lease nothing (the worker is stopping): release and ring only
-- ARGV[10] the leased job's broker message, less its own fields ('' none: the caller
--          publishes it): pushed to KEYS[16], its broker queue (jobs.index.values.MessagePush)
-- ARGV[11] the token the message carries ('' none), its fourth argument
-- ARGV[12] '1': keep the ending attempt's lease (the caller releases it after its commit,
--          release.lua, announcing and counting there, ringing there when nothing was
--          leased): the next job is chosen as if it were released, its slot counted free and
--          its tenant's lease not counted, and the lease is put back as it was, ending
--          (common.lua's ENDING: the pool counts its slot as the next job's until the
--          release) when a next job took it; ARGV[3] and ARGV[4] are then ignored and the
--          doorbell is not rung
-- Returns {} or {{job, tenant, tier, order_key, attempt, expires_at, start_by ('' none)}}.
local job = ARGV[1]
local keep, kept = ARGV[12] == '1', nil
if keep then
  local at = redis.call('ZSCORE', LEASES, job)
  local m = at and meta_of(job)
  if m and attempt_of(m) == tonumber(ARGV[2]) then
    kept = {m[1], at}  -- set aside for the choice, put back after it
    redis.call('ZREM', LEASES, job)
    redis.call('ZREM', lkey(m[1]), job)
    local head = head_of(m[1])
    if head then refile(m[1], head) end  -- under its cap now, for the choice
  end
else
  if ARGV[3] == '1' then redis.call('PUBLISH', PREFIX .. 'changed', job) end
  if ARGV[4] ~= nil and ARGV[4] ~= '' then
    redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', ARGV[4], 1)
  end
  drop_lease(job, ARGV[2])
end
local now = now_or_server(ARGV[6])
local capacity = tonumber(ARGV[7])
if capacity == nil then capacity = live_slots(KEYS[14], KEYS[15], now) end
local out = {}
if ARGV[9] ~= '1' and whole() and not routed() and held_slots() < capacity then
  promote_due(now, tonumber(ARGV[8]))
  out = lease_next(1, now + tonumber(ARGV[5]))
end
if kept then
  redis.call('ZADD', LEASES, kept[2], job)
  redis.call('ZADD', lkey(kept[1]), kept[2], job)
  if #out > 0 then redis.call('SADD', ENDING, job) end  -- its slot is the next job's now
  local head = head_of(kept[1])
  if head then refile(kept[1], head) end  -- its tenant counts the lease again
end
if #out == 0 then
  if not keep then ring() end
elseif ARGV[10] ~= nil and ARGV[10] ~= '' then
  push_message(KEYS[16], ARGV[10], '', out[1], tonumber(ARGV[5]), now, ARGV[11])
end
return out
