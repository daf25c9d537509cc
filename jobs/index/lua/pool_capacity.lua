-- pool_capacity.lua: drop expired worker registrations, return the live workers' slots.
-- KEYS[1] workers (zset worker -> expires_at)  KEYS[2] worker_slots (hash worker -> slots)
-- ARGV[1] now ('' Redis's clock; a registration is live while expires_at > now)
-- Returns the sum of the live workers' slots.
local now = ARGV[1]
if now == nil or now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, worker in ipairs(gone) do
  redis.call('ZREM', KEYS[1], worker)
  redis.call('HDEL', KEYS[2], worker)
end
local total = 0
for _, worker in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  total = total + (tonumber(redis.call('HGET', KEYS[2], worker)) or 0)
end
return total
