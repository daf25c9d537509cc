-- workers.lua: the pool's live capacity (prepended to pool_capacity.lua and admit_new.lua).

-- Drop worker registrations expired at now (zset workers: worker -> expires_at; hash
-- slots: worker -> slots); the sum of the live workers' slots (live while expires_at > now).
local function live_slots(workers, slots, now)
  local gone = redis.call('ZRANGEBYSCORE', workers, '-inf', now)
  for _, worker in ipairs(gone) do
    redis.call('ZREM', workers, worker)
    redis.call('HDEL', slots, worker, worker .. '#device', worker .. '#memory',
               worker .. '#kinds')
  end
  local total = 0
  for _, worker in ipairs(redis.call('ZRANGE', workers, 0, -1)) do
    total = total + (tonumber(redis.call('HGET', slots, worker)) or 0)
  end
  return total
end
