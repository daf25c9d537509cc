-- admit.lua: index a job if its tier and tenant are under their bounds, atomically.
-- KEYS: the layout of common.lua, which is prepended (then admit_job.lua).
-- ARGV[1] job  ARGV[2] tenant  ARGV[3] tier  ARGV[4] order_key  ARGV[5] start_by ('' none)
-- ARGV[6] not_before ('' none)  ARGV[7] bound  ARGV[8] tenant quota ('' none)
-- ARGV[9] max position ('' none): refuse ('deadline') a job with more jobs ahead of it
-- ARGV[10] the caller's fencing token ('' unfenced): the leader's batch feeder passes it
-- Returns {accepted 0/1, tier_queued, tenant_queued, position, reason or '', duplicate 0/1}.
-- A new job is attempt 1. One accepted (not a duplicate) is counted as 'queued' in
-- counters:jobs (jobs.counters); a refusal here is no 429 (a batch item waits for room).
-- Fails NOTLEADER, changing nothing, when the token is not the leader's.
if fenced_out(ARGV[10]) then return redis.error_reply(NOT_LEADER) end
local r = admit_job(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7]),
                    tonumber(ARGV[8]), tonumber(ARGV[9]))
if r[1] == 1 and r[6] == 0 then redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', 'queued', 1) end
return r
