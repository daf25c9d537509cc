-- cancel.lua: remove a queued or delayed job; re-file its tenant.
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1] job  ARGV[2] the caller's fencing token ('' unfenced: the API)
-- Returns 1 when removed, 0 when the job is not queued or delayed (leased, unknown); fails
-- NOTLEADER, changing nothing, when the token is not the leader's.
if fenced_out(ARGV[2]) then return redis.error_reply(NOT_LEADER) end
local job = ARGV[1]
local m = meta_of(job)
if not (m and (redis.call('ZSCORE', qkey(m[1]), job) or redis.call('ZSCORE', DELAYED, job))) then
  return 0
end
unindex(job, m)
return 1
