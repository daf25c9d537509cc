-- requeue.lua: index jobs again without bound checks, replacing any entry of the same id
-- that belongs to an earlier attempt, or a queued entry of the same attempt. A later
-- attempt's entry, or a lease of the same attempt (dispatched after the caller read SQL; the
-- reaper takes it back if it is stale), is newer and kept.
-- KEYS: the layout of common.lua, which is prepended (KEYS[13] the leader lock).
-- ARGV[1] the caller's fencing token ('' unfenced: a worker's retry)
-- ARGV[2..]: groups of seven, one per job: job, tenant, tier, order_key, start_by ('' none),
--       not_before ('' none), attempt. Returns the number of jobs indexed. Fails NOTLEADER,
--       changing nothing, when the token is not the leader's.
if fenced_out(ARGV[1]) then return redis.error_reply(NOT_LEADER) end
local count = 0
-- A queued entry of the same attempt that is already as asked stays as it is: a rebuild
-- requeues every queued row over an index that mostly holds them.
local function as_asked(e, i)
  return e.state == 'queued' and e.tenant == ARGV[i + 1] and e.tier == ARGV[i + 2]
    and tonumber(e.order_key) == tonumber(ARGV[i + 3]) and ARGV[i + 5] == ''
    and tonumber(e.start_by) == tonumber(ARGV[i + 4])
end
for i = 2, #ARGV, 7 do
  local job, attempt = ARGV[i], tonumber(ARGV[i + 6])
  local e = locate(job, ARGV[i + 1], ARGV[i + 2])
  if not e or e.attempt < attempt or (e.attempt == attempt and e.state ~= 'leased') then
    if not (e and e.attempt == attempt and as_asked(e, i)) then
      if e then unindex(job, e) end
      index_job(job, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], attempt)
    elseif retier(ARGV[i + 1], ARGV[i + 2]) then  -- its tenant's tier is its latest job's
      local head = head_of(ARGV[i + 1])
      refile(ARGV[i + 1], head)
    end
    count = count + 1
  end
end
return count
