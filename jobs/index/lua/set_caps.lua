-- set_caps.lua: set tier caps (merged), replace all tenant cap overrides, then move every
-- blocked tenant that is now under its cap to runnable (caps change rarely: the one loop
-- over blocked tenants).
-- KEYS: the layout of common.lua, which is prepended (KEYS[13] the leader lock).
-- ARGV[1] the caller's fencing token ('' unfenced)
-- ARGV[2] number of tier pairs t; ARGV[3 .. 2+2t] tier, cap pairs; the rest: tenant, cap pairs
-- Returns the number of tenants moved to runnable; fails NOTLEADER, changing nothing, when
-- the token is not the leader's.
if fenced_out(ARGV[1]) then return redis.error_reply(NOT_LEADER) end
local tiers = tonumber(ARGV[2])
redis.call('DEL', TENANT_CAPS)
for i = 3, 2 + 2 * tiers, 2 do redis.call('HSET', TIER_CAPS, ARGV[i], ARGV[i + 1]) end
for i = 3 + 2 * tiers, #ARGV, 2 do redis.call('HSET', TENANT_CAPS, ARGV[i], ARGV[i + 1]) end
local blocked = redis.call('ZRANGE', BLOCKED, 0, -1, 'WITHSCORES')
local moved = 0
for i = 1, #blocked, 2 do
  local member = blocked[i]
  local _, tenant = unfiled(member)
  if not at_cap(tenant) then
    redis.call('ZREM', BLOCKED, member)
    redis.call('ZADD', RUNNABLE, blocked[i + 1], member)
    moved = moved + 1
  end
end
return moved
