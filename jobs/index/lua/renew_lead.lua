-- renew_lead.lua: extend the leader lock, only while it still holds the caller's token.
-- KEYS[1] leader  KEYS[2] leader_epoch (unused; the leadership scripts share their KEYS)
-- ARGV[1] token  ARGV[2] ttl in milliseconds (> 0)
-- Returns 1 when renewed, 0 when the lock expired or another holds it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
