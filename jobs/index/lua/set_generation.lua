-- set_generation.lua: set the index's epoch (the reconciler writes the same one to SQL), or
-- clear it ('': a rebuild of an index from an older snapshot begins; the fast paths lease
-- nothing until it ends, common.lua's whole), only while the caller leads.
-- KEYS[1] generation  KEYS[2] leader
-- ARGV[1] the epoch ('' clear it)  ARGV[2] the caller's fencing token ('' unfenced)
-- Returns 1 when set, 0 (changing nothing) when the token is not the leader's.
if ARGV[2] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
