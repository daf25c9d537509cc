-- put_back.lua: a lease whose job cannot start yet goes back to its queue, as it was indexed
-- (its meta), due again at not_before: a row not committed yet, or a publish that failed.
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1] job  ARGV[2] attempt  ARGV[3] not_before ('' due at once)
-- ARGV[4] the caller's fencing token ('' unfenced: a worker)
-- ARGV[5] a kind no live worker runs ('' none): the job is parked, its id noted in the set
--         parked:<kind> and the kind in kinds_waiting (common.lua's routed), so that
--         route_kinds.lua makes it due at once when a worker that runs the kind registers
-- Returns 1 when put back, 0 when no lease of that attempt is held (left alone).
if fenced_out(ARGV[4]) then return redis.error_reply(NOT_LEADER) end
local job = ARGV[1]
if not redis.call('ZSCORE', LEASES, job) then return 0 end
local e = locate(job, nil, nil)  -- a lease has meta
if e.attempt ~= tonumber(ARGV[2]) then return 0 end
unindex(job, e)
index_job(job, e.tenant, e.tier, e.order_key, e.start_by, ARGV[3], e.attempt)
if ARGV[5] ~= nil and ARGV[5] ~= '' then
  redis.call('SADD', PREFIX .. 'parked:' .. ARGV[5], job)
  redis.call('SADD', PREFIX .. 'kinds_waiting', ARGV[5])
end
return 1
