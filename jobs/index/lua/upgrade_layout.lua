-- upgrade_layout.lua: bring an index written by an earlier version to this layout, at the
-- start of a leader's full pass. That layout also kept every queued job in one zset of all
-- tiers (`queued`) and a tier's delayed jobs in the tier's zset: the first goes, and each
-- delayed job leaves its tier's zset and is counted in tier_delayed instead. O(delayed
-- jobs); the large zset is unlinked, freed in the background.
-- KEYS: the layout of common.lua, which is prepended (KEYS[13] the leader lock).
-- ARGV[1] the caller's fencing token ('' unfenced)
-- Returns 1 when it upgraded, 0 when the index was in this layout already.
if fenced_out(ARGV[1]) then return redis.error_reply(NOT_LEADER) end
local old = PREFIX .. 'queued'
if redis.call('EXISTS', old) == 0 then return 0 end
redis.call('UNLINK', old)
for _, tier in ipairs(redis.call('HKEYS', TIER_CAPS)) do
  redis.call('HSETNX', TIER_DELAYED, tier, 0)
end
for _, tier in ipairs(redis.call('HVALS', TENANT_TIER)) do
  redis.call('HSETNX', TIER_DELAYED, tier, 0)
end
for _, job in ipairs(redis.call('ZRANGE', DELAYED, 0, -1)) do
  local m = meta_of(job)
  if m and redis.call('ZREM', tkey(m[2]), job) == 1 then
    redis.call('HINCRBY', TIER_DELAYED, m[2], 1)
  end
end
return 1
