-- rate_limit.lua: take one token from a tenant's token bucket, if it holds one.
-- token_bucket.lua is prepended.
-- KEYS[1] the tenant's bucket (hash: tokens, at)
-- ARGV[1] rate (tokens added per second, > 0)  ARGV[2] burst (bucket size, >= 1)
-- ARGV[3] now (epoch seconds; '' Redis's clock, the one clock of every API replica)
-- Returns {allowed 0/1, seconds until the next token ('0' when allowed), tokens left};
-- the numbers as strings, so that fractions survive the trip.
local rate, burst, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local allowed, wait, tokens = take_token(KEYS[1], rate, burst, now)
return {allowed, string.format('%.17g', wait), string.format('%.17g', tokens)}
