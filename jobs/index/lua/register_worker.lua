-- register_worker.lua: record a live worker's slots and device until Redis's clock + ttl.
-- KEYS[1] workers (zset worker -> expires_at)  KEYS[2] worker_slots (hash worker -> slots,
-- worker .. '#device' -> its device, 'cuda:N' or 'cpu', and worker .. '#memory' -> the
-- device's memory in bytes, on a GPU)
-- ARGV[1] worker  ARGV[2] slots  ARGV[3] ttl in seconds  ARGV[4] now ('' Redis's clock)
-- ARGV[5] device ('' cpu)  ARGV[6] memory in bytes ('' not known)
local now = ARGV[4]
if now == nil or now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local device = ARGV[5]
if device == nil or device == '' then device = 'cpu' end
redis.call('ZADD', KEYS[1], string.format('%.17g', now + tonumber(ARGV[3])), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2], ARGV[1] .. '#device', device)
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1] .. '#memory', ARGV[6])
else
  redis.call('HDEL', KEYS[2], ARGV[1] .. '#memory')
end
return 1
