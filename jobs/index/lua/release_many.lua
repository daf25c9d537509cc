-- release_many.lua: release.lua for the items of a packed run once their endings are
-- committed (jobs.execution.packing), in one call: each lease of its attempt dropped and its
-- tenant re-filed; each item's move counted and announced (one message). Riders hold no slot
-- of the pool, so their release frees none and rings nobody.
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1..] three arguments per item: job, attempt, the status it moved to ('' none: not
-- counted nor announced, a lease only given up)
-- Returns the number of leases dropped.
local dropped, moved = 0, {}
for i = 1, #ARGV - 2, 3 do
  local job, status = ARGV[i], ARGV[i + 2]
  if status ~= '' then
    moved[#moved + 1] = job
    redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', status, 1)
  end
  if drop_lease(job, ARGV[i + 1]) then dropped = dropped + 1 end
end
if #moved > 0 then redis.call('PUBLISH', PREFIX .. 'changed', table.concat(moved, ' ')) end
return dropped
