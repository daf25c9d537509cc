-- release.lua: drop a lease of one attempt; re-file its tenant; ring the doorbell if asked.
-- KEYS: the layout of common.lua, which is prepended (KEYS[13] the leader lock).
-- ARGV[1] job  ARGV[2] attempt ('' any: maintenance of a finished job)
-- ARGV[3] the caller's fencing token ('' unfenced: a worker or the API)
-- ARGV[4] '1': a slot was freed, wake the dispatcher (jobs.wake) in this same round trip;
--         '2': only when a job is runnable (a hand-over that took nothing though one was:
--         the pool was full of leases kept until their next job's first renewal)
-- ARGV[5] '1': the job's status just moved (its SQL commit came first): publish its id on
--         the 'changed' channel (jobs.notify), whether or not a lease was still held
-- ARGV[6] the status the job just moved to ('' none): counted in counters:jobs
--         (jobs.counters), whether or not a lease was still held
-- Returns 1 when the tenant moved from blocked to runnable, else 0 (also: no such lease, or
-- the lease belongs to another attempt, which is left alone).
if fenced_out(ARGV[3]) then return redis.error_reply(NOT_LEADER) end
local job = ARGV[1]
if ARGV[5] == '1' then redis.call('PUBLISH', PREFIX .. 'changed', job) end
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', ARGV[6], 1)
end
local dropped, unblocked = drop_lease(job, ARGV[2])
if dropped and (ARGV[4] == '1' or (ARGV[4] == '2' and redis.call('ZCARD', RUNNABLE) > 0)) then
  ring()
end
if unblocked then return 1 end
return 0
