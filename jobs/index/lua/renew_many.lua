-- renew_many.lua: renew.lua for the items of a packed run (jobs.execution.packing), in one
-- call: each lease of its attempt extended to Redis's now + ttl (never moved back), its
-- start's figures recorded with its first renewal, the starts announced in one message.
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV[1] ttl in seconds  ARGV[2] now ('' Redis's clock)  ARGV[3] '1': announce each item
-- whose lease is held on 'changed' (its start, committed first)
-- ARGV[4..] eight arguments per item: job, attempt, then renew.lua's ARGV[6..11] (its
-- start's figures: '' six times for none)
-- Returns one reply per item, in order: 0 lost, 1 renewed, 2 renewed and a cancel asked.
local now = now_or_server(ARGV[2])
local expires_at = now + tonumber(ARGV[1])
local out, moved = {}, {}
for i = 4, #ARGV - 7, 8 do
  local job, attempt = ARGV[i], tonumber(ARGV[i + 1])
  local current = redis.call('ZSCORE', LEASES, job)
  local m = current and meta_of(job)
  if not m or attempt_of(m) ~= attempt then
    out[#out + 1] = 0
  else
    if expires_at > tonumber(current) then
      redis.call('ZADD', LEASES, 'XX', expires_at, job)
      redis.call('ZADD', lkey(m[1]), 'XX', expires_at, job)
    end
    if ARGV[3] == '1' then moved[#moved + 1] = job end
    local bucket, wait = ARGV[i + 2], ARGV[i + 3]
    if bucket ~= '' then
      local tier = m[2]
      redis.pcall('HINCRBY', PREFIX .. 'counters:jobs', 'running', 1)
      local waits = PREFIX .. 'hist:wait:' .. tier
      redis.pcall('HINCRBY', waits, bucket, 1)
      redis.pcall('HINCRBYFLOAT', waits, 'sum', wait)
      if ARGV[i + 4] ~= '' then
        local latency = PREFIX .. 'hist:dispatch:' .. tier
        redis.pcall('HINCRBY', latency, ARGV[i + 4], 1)
        redis.pcall('HINCRBYFLOAT', latency, 'sum', ARGV[i + 5])
      end
      local recent = PREFIX .. 'recent_waits:' .. tier
      redis.pcall('ZADD', recent, now, wait .. '|' .. job)
      local oldest = string.format('%.17g', now - tonumber(ARGV[i + 6]))
      redis.pcall('ZREMRANGEBYSCORE', recent, '-inf', '(' .. oldest)
      redis.pcall('ZREMRANGEBYRANK', recent, 0, -(tonumber(ARGV[i + 7]) + 1))
    end
    out[#out + 1] = (m[7] == 1) and 2 or 1
  end
end
if #moved > 0 then redis.call('PUBLISH', PREFIX .. 'changed', table.concat(moved, ' ')) end
return out
