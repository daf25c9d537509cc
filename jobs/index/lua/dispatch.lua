-- dispatch.lua: promote due delayed jobs, then lease up to n jobs in order-key order across
-- runnable tenants; a tenant found at its cap moves to blocked (it does not count toward n).
-- KEYS: the layout of common.lua (prepended, then workers.lua; KEYS[13] the leader lock),
-- then KEYS[14] workers  KEYS[15] worker_slots (register_worker.lua)
-- ARGV[1] n  ARGV[2] now ('' Redis's clock)  ARGV[3] lease ttl in seconds
-- ARGV[4] promote limit  ARGV[5] the caller's fencing token ('' unfenced)
-- ARGV[6] the pool's capacity ('' none): n is cut to the slots it leaves free, counted here
--         (leases kept while ending hold none), so a dispatch round needs no round trip to
--         count the leases first; and to the live workers' slots, whatever the capacity
--         configured: no lease is taken into slots that are not there (a pool scaled to
--         zero, a worker still loading its models), where it would only lapse
-- The leases handed out are counted as 'dispatched' in counters:jobs (jobs.counters; with
-- redis.pcall: a metric never fails the dispatch).
-- ARGV[7] '1': say whether the pool is routed by kind (common.lua's routed): the reply then
--         ends with the string 'routed' when it is, and the caller routes the leases
-- Returns {{job, tenant, tier, order_key, attempt, expires_at, start_by ('' none)}, ...} in
-- dispatch order; a lease belongs to the attempt its entry was indexed with, and keeps its
-- meta (start_by included: a lease queued again from the reply keeps its deadline; the
-- lease costs no byte more than the queued entry did). Fails NOTLEADER, changing nothing,
-- when the token is not the leader's.
if fenced_out(ARGV[5]) then return redis.error_reply(NOT_LEADER) end
local n, now = tonumber(ARGV[1]), now_or_server(ARGV[2])
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  local slots = math.min(tonumber(ARGV[6]), live_slots(KEYS[14], KEYS[15], now))
  n = math.min(n, slots - held_slots())
  if n <= 0 then return {} end
end
local expires_at = now + tonumber(ARGV[3])

promote_due(now, tonumber(ARGV[4]))
local out = lease_next(n, expires_at)
if ARGV[7] == '1' and routed() then out[#out + 1] = 'routed' end
return out
