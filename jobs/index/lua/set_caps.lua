-- set_caps.lua: set tier caps (merged), replace all tenant cap overrides, then move every
-- blocked tenant that is now under its cap to runnable (caps change rarely: the one loop
-- over blocked tenants).
-- KEYS[1] prefix  [2] runnable  [3] blocked  [4] queued  [5] delayed  [6] deadlines
--      [7] leases  [8] meta  [9] tier_caps  [10] tenant_caps  [11] tenant_tier
--      [12] tenant_delayed  (the layout of common.lua, which is prepended)
-- ARGV[1] number of tier pairs t; ARGV[2 .. 1+2t] tier, cap pairs; the rest: tenant, cap pairs
-- Returns the number of tenants moved to runnable.
local tiers = tonumber(ARGV[1])
redis.call('DEL', TENANT_CAPS)
for i = 2, 1 + 2 * tiers, 2 do redis.call('HSET', TIER_CAPS, ARGV[i], ARGV[i + 1]) end
for i = 2 + 2 * tiers, #ARGV, 2 do redis.call('HSET', TENANT_CAPS, ARGV[i], ARGV[i + 1]) end
local blocked = redis.call('ZRANGE', BLOCKED, 0, -1, 'WITHSCORES')
local moved = 0
for i = 1, #blocked, 2 do
  local job = blocked[i]
  if not at_cap(meta_of(job)[1]) then
    redis.call('ZREM', BLOCKED, job)
    redis.call('ZADD', RUNNABLE, blocked[i + 1], job)
    moved = moved + 1
  end
end
return moved
