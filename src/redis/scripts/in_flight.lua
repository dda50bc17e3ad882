-- in-flight: at most L units held at once (held.lua keeps the holders).
-- Admitted iff h + n <= L; remaining L - h; a refusal waits for a release.
-- A refund gives such a rule nothing back and leaves it out of its answer
-- (the empty reply).
if refunding then
  return {}
end
local h = held_units(key, now)
if not check then
  return {0, max(L - h, 0), 0, 0}
end
if h + cost <= L then
  hold(key, now, cost)
  return {1, L - h - cost, 0, 0}
end
return {0, max(L - h, 0), NEVER_WAIT, 0}
