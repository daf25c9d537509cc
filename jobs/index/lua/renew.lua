-- renew.lua: extend the lease of one attempt to Redis's now + ttl; never moves it back.
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1] job  ARGV[2] attempt  ARGV[3] ttl in seconds  ARGV[4] now ('' Redis's clock)
-- ARGV[5] '1': the job's status just moved (a worker's start, committed first): publish its
--         id on the 'changed' channel (jobs.notify) in this same round trip
-- Returns 0 when the lease is gone or belongs to another attempt (the caller has lost it
-- and must stop), 1 when renewed, 2 when renewed and a cancel was requested for the job
-- (flag_cancel.lua): the renewal is how a running job learns of it, with no SQL read.
local job, attempt = ARGV[1], tonumber(ARGV[2])
if ARGV[5] == '1' then redis.call('PUBLISH', PREFIX .. 'changed', job) end
local current = redis.call('ZSCORE', LEASES, job)
if not current then return 0 end
local m = meta_of(job)
if attempt_of(m) ~= attempt then return 0 end
local expires_at = now_or_server(ARGV[4]) + tonumber(ARGV[3])
if expires_at > tonumber(current) then
  redis.call('ZADD', LEASES, 'XX', expires_at, job)
  redis.call('ZADD', lkey(m[1]), 'XX', expires_at, job)
end
if m[7] == 1 then return 2 end
return 1
