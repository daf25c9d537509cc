-- entries.lua: what the index holds for each job named (the reconciler's check of SQL's rows).
-- KEYS: the layout of common.lua, which is prepended.
-- ARGV: job ids.
-- Returns, per job in order, {attempt, leased 0/1} for a job queued, delayed or leased, {0, 0}
-- for one the index does not hold (a stray meta entry, holding no place, included).
local out = {}
for i = 1, #ARGV do
  local e = locate(ARGV[i], nil, nil)
  if e and e.state ~= 'none' then
    out[i] = {e.attempt, e.state == 'leased' and 1 or 0}
  else
    out[i] = {0, 0}
  end
end
return out
