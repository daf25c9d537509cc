-- route_kinds.lua: the leader's upkeep of routing by kind (jobs.index.worker_registry):
-- forget waiting kinds no job is left of, bring the parked jobs of kinds a live worker runs
-- now back to their places at once, then route the pool by kind (common.lua's routed) while
-- its live workers' kinds differ, or a waiting kind is one some live worker does not run
-- (or no worker is live), and stop routing otherwise.
-- KEYS: the layout of common.lua (prepended, then workers.lua), then KEYS[14] workers
-- KEYS[15] worker_slots (register_worker.lua)
-- ARGV[1] now ('' Redis's clock)  ARGV[2] the caller's fencing token ('' unfenced)
-- ARGV[3] n  ARGV[4 .. 3 + n] the kinds to forget, with their parked jobs' notes
-- ARGV[4 + n ..] the kinds whose parked jobs are due at once (their notes go)
-- Returns {routed (1 or 0), waiting kind, ...}. Fails NOTLEADER, changing nothing, when the
-- token is not the leader's.
if fenced_out(ARGV[2]) then return redis.error_reply(NOT_LEADER) end
local now = now_or_server(ARGV[1])
local WAITING, SHARED, ROUTED = PREFIX .. 'kinds_waiting', PREFIX .. 'kinds', PREFIX .. 'routed'
local forget = tonumber(ARGV[3])
for i = 4, 3 + forget do
  redis.call('SREM', WAITING, ARGV[i])
  redis.call('DEL', PREFIX .. 'parked:' .. ARGV[i])
end
local woke = 0
for i = 4 + forget, #ARGV do
  local parked = PREFIX .. 'parked:' .. ARGV[i]
  for _, job in ipairs(redis.call('SMEMBERS', parked)) do
    if redis.call('ZSCORE', DELAYED, job) then  -- still parked, not cancelled
      local m = meta_of(job)
      undelay(job, m[1], m[2])
      enqueue(job, m[1], m[2], m[3], false)
      woke = woke + 1
    end
  end
  redis.call('DEL', parked)
end
if woke > 0 then ring() end

live_slots(KEYS[14], KEYS[15], now)  -- expired registrations dropped
local first, same = nil, true
for _, worker in ipairs(redis.call('ZRANGE', KEYS[14], 0, -1)) do
  local kinds = redis.call('HGET', KEYS[15], worker .. '#kinds') or ''
  if first == nil then first = kinds elseif kinds ~= first then same = false end
end
if first == nil then
  redis.call('DEL', SHARED)  -- the next worker to register sets it
elseif same then
  redis.call('SET', SHARED, first)
end
local waiting = redis.call('SMEMBERS', WAITING)
local route = not same or (first == nil and #waiting > 0)
if not route and first ~= nil and first ~= '' and #waiting > 0 then
  local runs = {}
  for _, kind in ipairs(cjson.decode(first)) do runs[kind] = true end
  for _, kind in ipairs(waiting) do
    if not runs[kind] then route = true end
  end
end
if route then redis.call('SET', ROUTED, '1') else redis.call('DEL', ROUTED) end
local out = {route and 1 or 0}
for _, kind in ipairs(waiting) do out[#out + 1] = kind end
return out
