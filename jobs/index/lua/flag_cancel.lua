-- flag_cancel.lua: tell the worker holding a job's lease that a cancel was requested; its
-- next renewal (renew.lua) answers 2. The flag lives in the lease's meta entry, so it goes
-- with the lease (release, reap, a restored lease) and never outlives the attempt.
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1] job  ARGV[2] attempt ('' whichever attempt holds the lease)
-- Returns 1 when a lease of that attempt carries the flag now, 0 when there is none.
local job = ARGV[1]
if not redis.call('ZSCORE', LEASES, job) then return 0 end
local m = meta_of(job)
if ARGV[2] ~= '' and attempt_of(m) ~= tonumber(ARGV[2]) then return 0 end
if m[7] ~= 1 then
  m[7] = 1
  redis.call('HSET', META, job, cjson.encode(m))
end
return 1
