-- register_worker.lua: record a live worker's slots, device and kinds until Redis's clock +
-- ttl; a worker whose kinds are not those the pool's live workers share routes the pool by
-- kind (common.lua's routed; route_kinds.lua turns it off once they agree again).
-- KEYS[1] workers (zset worker -> expires_at)  KEYS[2] worker_slots (hash worker -> slots,
-- worker .. '#device' -> its device, 'cuda:N' or 'cpu', worker .. '#memory' -> the
-- device's memory in bytes, on a GPU, and worker .. '#kinds' -> the kinds it runs, a sorted
-- JSON array, '' when it said none)  KEYS[3] kinds (the kinds every live worker registered,
-- as they are, while they are the same)  KEYS[4] routed (the pool's flag)
-- ARGV[1] worker  ARGV[2] slots  ARGV[3] ttl in seconds  ARGV[4] now ('' Redis's clock)
-- ARGV[5] device ('' cpu)  ARGV[6] memory in bytes ('' not known)  ARGV[7] kinds ('' none)
local now = ARGV[4]
if now == nil or now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local device = ARGV[5]
if device == nil or device == '' then device = 'cpu' end
local kinds = ARGV[7] or ''
redis.call('ZADD', KEYS[1], string.format('%.17g', now + tonumber(ARGV[3])), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2], ARGV[1] .. '#device', device,
           ARGV[1] .. '#kinds', kinds)
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1] .. '#memory', ARGV[6])
else
  redis.call('HDEL', KEYS[2], ARGV[1] .. '#memory')
end
local shared = redis.call('GET', KEYS[3])
if not shared then
  redis.call('SET', KEYS[3], kinds)
elseif shared ~= kinds then
  redis.call('SET', KEYS[4], '1')
end
return 1
