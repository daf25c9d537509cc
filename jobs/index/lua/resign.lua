-- resign.lua: give the leader lock up, only while it still holds the caller's token.
-- KEYS[1] leader  KEYS[2] leader_epoch (unused; the leadership scripts share their KEYS)
-- ARGV[1] token
-- Returns 1 when the lock was released, 0 when it was not the caller's.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
