-- lead.lua: take the leader lock if nobody holds it, with a fresh fencing token.
-- KEYS[1] leader (string: the holder's token, with a TTL)  KEYS[2] leader_epoch (counter)
-- ARGV[1] owner (who asks; part of the token)  ARGV[2] ttl in milliseconds (> 0)
-- Returns the new token '<epoch>:<owner>', or false when the lock is held. The epoch grows
-- with every acquisition; the owner part keeps tokens unique even after the counter was
-- lost with the rest of Redis's data.
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2]) .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], token, 'PX', tonumber(ARGV[2]))
return token
