-- live_workers.lua: the live workers (registration not expired at now), expired ones dropped.
-- KEYS[1] workers  KEYS[2] worker_slots (register_worker.lua)  ARGV[1] now ('' Redis's clock)
-- Returns {{worker, slots, device, expires_at, memory ('' not known), kinds ('' none)}, ...}.
local now = ARGV[1]
if now == nil or now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
live_slots(KEYS[1], KEYS[2], tonumber(now))
local out = {}
local live = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #live, 2 do
  local worker = live[i]
  local slots = redis.call('HGET', KEYS[2], worker) or '0'
  local device = redis.call('HGET', KEYS[2], worker .. '#device') or 'cpu'
  local memory = redis.call('HGET', KEYS[2], worker .. '#memory') or ''
  local kinds = redis.call('HGET', KEYS[2], worker .. '#kinds') or ''
  out[#out + 1] = {worker, slots, device, live[i + 1], memory, kinds}
end
return out
