-- renew.lua: extend the lease of one attempt to Redis's now + ttl; never moves it back.
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1] job  ARGV[2] attempt  ARGV[3] ttl in seconds  ARGV[4] now ('' Redis's clock)
-- ARGV[5] '1': the job's status just moved (a worker's start, committed first): publish its
--         id on the 'changed' channel (jobs.notify) in this same round trip
-- ARGV[6..11] (a start only, '' or absent otherwise; jobs.counters.StartFigures): the queue
--         wait's bucket and value, the dispatch latency's bucket and value ('' none), the
--         window of recent waits in seconds and how many of them to keep. Recorded only when
--         the lease is held: counts 'running' in counters:jobs and adds to the tier's
--         histograms (hist:wait:<tier>, hist:dispatch:<tier>) and its recent waits, each
--         with redis.pcall: a metric that cannot be written never fails the renewal.
-- ARGV[12..14] ('' or absent: none) an attempt whose ending is committed, released first
--         (release.lua's steps): its job, attempt, and the status it moved to (announced on
--         'changed' and counted in counters:jobs). Its slot went to this job already, but
--         while it was held another slot that freed may have found the pool full: when the
--         release leaves a slot free (ARGV[15] the pool's capacity, '' the live workers'
--         slots: KEYS[14] workers, KEYS[15] worker_slots) and a job runnable, the doorbell
--         rings.
-- Returns 0 when the lease is gone or belongs to another attempt (the caller has lost it
-- and must stop), 1 when renewed, 2 when renewed and a cancel was requested for the job
-- (flag_cancel.lua): the renewal is how a running job learns of it, with no SQL read.
-- The ids to announce go out in one message (jobs.notify splits a message's ids on spaces).
local moved = {}
if ARGV[12] ~= nil and ARGV[12] ~= '' then
  moved[1] = ARGV[12]
  redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', ARGV[14], 1)
  if drop_lease(ARGV[12], ARGV[13]) and redis.call('ZCARD', RUNNABLE) > 0 then
    local capacity = tonumber(ARGV[15])
    if capacity == nil then capacity = live_slots(KEYS[14], KEYS[15], now_or_server(ARGV[4])) end
    if held_slots() < capacity then ring() end
  end
end
local job, attempt = ARGV[1], tonumber(ARGV[2])
if ARGV[5] == '1' then moved[#moved + 1] = job end
if #moved > 0 then redis.call('PUBLISH', PREFIX .. 'changed', table.concat(moved, ' ')) end
local current = redis.call('ZSCORE', LEASES, job)
if not current then return 0 end
local m = meta_of(job)
if attempt_of(m) ~= attempt then return 0 end
local expires_at = now_or_server(ARGV[4]) + tonumber(ARGV[3])
if expires_at > tonumber(current) then
  redis.call('ZADD', LEASES, 'XX', expires_at, job)
  redis.call('ZADD', lkey(m[1]), 'XX', expires_at, job)
end
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  local tier = m[2]
  redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', 'running', 1)
  local waits = PREFIX .. 'hist:wait:' .. tier
  redis.pcall('HINCRBY', waits, ARGV[6], 1)
  redis.pcall('HINCRBYFLOAT', waits, 'sum', ARGV[7])
  if ARGV[8] ~= '' then
    local latency = PREFIX .. 'hist:dispatch:' .. tier
    redis.pcall('HINCRBY', latency, ARGV[8], 1)
    redis.pcall('HINCRBYFLOAT', latency, 'sum', ARGV[9])
  end
  local now = now_or_server(ARGV[4])
  local recent = PREFIX .. 'recent_waits:' .. tier
  redis.pcall('ZADD', recent, now, ARGV[7] .. '|' .. job)
  local oldest = string.format('%.17g', now - tonumber(ARGV[10]))
  redis.pcall('ZREMRANGEBYSCORE', recent, '-inf', '(' .. oldest)
  redis.pcall('ZREMRANGEBYRANK', recent, 0, -(tonumber(ARGV[11]) + 1))
end
if m[7] == 1 then return 2 end
return 1
