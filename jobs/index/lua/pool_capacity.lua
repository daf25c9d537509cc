-- pool_capacity.lua: drop expired worker registrations, return the live workers' slots.
-- workers.lua is prepended.
-- KEYS[1] workers (zset worker -> expires_at)  KEYS[2] worker_slots (hash worker -> slots)
-- ARGV[1] now ('' Redis's clock; a registration is live while expires_at > now)
-- Returns the sum of the live workers' slots.
local now = ARGV[1]
if now == nil or now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
return live_slots(KEYS[1], KEYS[2], now)
