-- set_generation.lua: set the index's epoch (the reconciler writes the same one to SQL),
-- only while the caller leads.
-- KEYS[1] generation  KEYS[2] leader
-- ARGV[1] the epoch  ARGV[2] the caller's fencing token ('' unfenced)
-- Returns 1 when set, 0 (changing nothing) when the token is not the leader's.
if ARGV[2] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
