-- rate_limit.lua: take one token from a tenant's token bucket, if it holds one.
-- KEYS[1] the tenant's bucket (hash: tokens, at)
-- ARGV[1] rate (tokens added per second, > 0)  ARGV[2] burst (bucket size, >= 1)
-- ARGV[3] now (epoch seconds; '' Redis's clock, the one clock of every API replica)
-- Returns {allowed 0/1, seconds until the next token ('0' when allowed), tokens left};
-- the numbers as strings, so that fractions survive the trip.
-- A bucket starts full. A caller whose clock is behind the last one adds no tokens and never
-- moves 'at' back. The key expires once the bucket would be full again: absent means full.
local rate, burst, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
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
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
           'at', string.format('%.17g', at))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {allowed, string.format('%.17g', wait), string.format('%.17g', tokens)}
