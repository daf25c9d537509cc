-- offer.lua: a submit's last step, after its COMMIT (jobs.admission.submit): when the pool
-- has a free slot, lease the best runnable job (dispatch.lua's order, caps and count: not
-- necessarily the one just submitted) and push its message to its tier's broker queue, so
-- no dispatcher round sits between a submit and its start while a slot is idle. With a slot
-- free and nothing leased (nothing runnable under the caps: a batch to feed, say), no
-- message to push, an index not rebuilt since it lost its data (common.lua's whole), or a
-- pool routed by kind (common.lua's routed: the dispatcher reads its jobs' kinds), the
-- doorbell rings instead; with no slot free, nothing happens: the next slot to free takes
-- the best job itself (hand_over.lua).
-- KEYS: the layout of common.lua (prepended, then workers.lua and push.lua), then KEYS[14]
-- workers  KEYS[15] worker_slots  KEYS[16..] the tier queues' lists, one per tier of ARGV[7..]
-- ARGV[1] lease ttl in seconds  ARGV[2] now ('' Redis's clock)
-- ARGV[3] the pool's capacity ('' the live workers' slots; a configured one is cut to them:
--         no lease is taken into slots that are not there)  ARGV[4] promote limit
-- ARGV[5] the message envelope ('' none: lease nothing, ring when a slot is free)
-- ARGV[6] the number of tier queues  ARGV[7..] their tiers, then as many routing keys
-- Returns {} or {{job, tenant, tier, order_key, attempt, expires_at, start_by ('' none),
-- pushed (1 or 0: the leased job's tier has no queue here, the caller puts it back)}}.
local now = now_or_server(ARGV[2])
local capacity = live_slots(KEYS[14], KEYS[15], now)
if tonumber(ARGV[3]) ~= nil then capacity = math.min(capacity, tonumber(ARGV[3])) end
if held_slots() >= capacity then return {} end
if ARGV[5] == nil or ARGV[5] == '' or not whole() or routed() then
  ring()
  return {}
end
local ttl = tonumber(ARGV[1])
promote_due(now, tonumber(ARGV[4]))
local out = lease_next(1, now + ttl)
if #out == 0 then
  ring()
  return {}
end
local lease, queues = out[1], tonumber(ARGV[6])
for i = 1, queues do
  if ARGV[6 + i] == lease[3] then
    push_message(KEYS[15 + i], ARGV[5], ARGV[6 + queues + i], lease, ttl, now, '')
    lease[8] = 1
    return out
  end
end
lease[8] = 0
return out
