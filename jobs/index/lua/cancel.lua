-- cancel.lua: remove a queued or delayed job; re-file its tenant.
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1] job  ARGV[2] the caller's fencing token ('' unfenced: the API)
-- ARGV[3] the job's tenant ('' unknown: a queued job without meta is then searched for in
--         every queue, common.lua's find_tenant; maintenance only)
-- Returns 1 when removed, 0 when the job is not queued or delayed (leased, unknown); fails
-- NOTLEADER, changing nothing, when the token is not the leader's.
if fenced_out(ARGV[2]) then return redis.error_reply(NOT_LEADER) end
local job = ARGV[1]
local tenant = ARGV[3]
if tenant == nil or tenant == '' then tenant = nil end
local e = locate(job, tenant, nil)
if not (e and (e.state == 'queued' or e.state == 'delayed')) then return 0 end
unindex(job, e)
return 1
