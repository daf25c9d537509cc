-- record_run.lua: one run a worker started (jobs.index.counters.record_run). Standalone: no
-- common.lua; every write is a counter, and the caller logs a failure, never raises it.
-- KEYS[1] hist:run_items:<kind>   the kind's histogram of items per run (bucket -> runs, sum)
-- KEYS[2] run_kinds               set: the kinds that recorded a run (what /metrics reads)
-- KEYS[3] counters:items_started  counter: items started in the pool
-- KEYS[4] items_started:          the stem of the per-slot counts (the slot's number follows;
--                                 it carries the prefix's hash tag, so they share its slot)
-- ARGV[1] kind  ARGV[2] the run's bucket (an ``le`` label)  ARGV[3] items in the run
-- ARGV[4] now ('' Redis's clock)  ARGV[5] seconds a slot spans  ARGV[6] seconds a slot is kept
local items = tonumber(ARGV[3])
redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
redis.call('HINCRBY', KEYS[1], 'sum', items)
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('INCRBY', KEYS[3], items)
local now = tonumber(ARGV[4])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local slot = KEYS[4] .. string.format('%d', math.floor(now / tonumber(ARGV[5])))
redis.call('INCRBY', slot, items)
redis.call('EXPIRE', slot, tonumber(ARGV[6]))
return 1
