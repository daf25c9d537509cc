-- token_bucket.lua: a tenant's request-rate token bucket (prepended to the scripts that
-- take a token: rate_limit.lua, admit_new.lua).
-- The bucket is a hash {tokens, at}. It starts full. A caller whose clock is behind the last
-- one adds no tokens and never moves 'at' back. The key expires once the bucket would be full
-- again: absent means full.

-- Take one token from the bucket at key if it holds one.
-- Returns allowed (0/1), seconds until the next token (0 when allowed), tokens left.
local function take_token(key, rate, burst, now)
  local state = redis.call('HMGET', key, 'tokens', 'at')
  local tokens, at = tonumber(state[1]), tonumber(state[2])
  if not tokens or not at then
    tokens, at = burst, now
  end
  if now > at then
    tokens = tokens + (now - at) * rate
    at = now
  end
  tokens = math.min(burst, tokens)
  local allowed, wait = 0, 0
  if tokens >= 1 then
    tokens = tokens - 1
    allowed = 1
  else
    wait = (1 - tokens) / rate
  end
  redis.call('HSET', key, 'tokens', string.format('%.17g', tokens),
             'at', string.format('%.17g', at))
  redis.call('PEXPIRE', key, math.ceil((burst - tokens) / rate * 1000) + 1000)
  return allowed, wait, tokens
end
