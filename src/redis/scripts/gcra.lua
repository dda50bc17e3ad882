-- gcra and leaky-bucket (`leaky`): the theoretical arrival time `t`.
-- With I = floor(W / L) and tau = I * (L - 1) <= W, the TAT stays within
-- one window past the latest `now`, below 2^52 + 2^50.
local state = redis.call('HMGET', key, 'o', 't')
local origin = tonumber(state[1])
local new = origin == nil
local tat = 0
if new then
  origin = now
else
  tat = tonumber(state[2])
end
local r, lag = since(now, origin)
local I = idiv(W, L)
local tau = I * (L - 1)
if refunding then
  if new or now - refunding >= W then
    return {0}
  end
  -- g = min(n, L - remaining(r)), the TAT moved back g intervals from
  -- t = max(TAT, r), never before r.
  local t = max(tat, r)
  local left = 0
  if t - r <= tau then
    left = idiv(tau - (t - r), I) + 1
  end
  local g = min(cost, L - left)
  if g > 0 then
    tat = max(t - g * I, r)
    rewrite(key, tat - (now - origin), 'o', int(origin), 't', int(tat))
  end
  return {g}
end
-- A state whose TAT is `s` has the TTL s - (now - origin): it is empty once
-- the TAT is not ahead of `now`, since from then on max(TAT, now) = now,
-- exactly as for a new client (gcra has no grid).

-- The last of the `cost` single requests is at t + (cost - 1) * I; the
-- admission moves the TAT on by cost * I <= L * I <= W.
local t = max(tat, r)
local last = t + (cost - 1) * I
if check and last - r <= tau then
  local delay = 0
  if leaky then
    delay = t - r + lag
  end
  tat = t + cost * I
  store(key, tat - (now - origin), 'o', int(origin), 't', int(tat))
  local ahead = tat - r
  if ahead <= tau then
    return {1, idiv(tau - ahead, I) + 1, 0, delay}
  end
  return {1, 0, 0, delay}
end
-- The remaining at the TAT as it stays.
local remaining = 0
if t - r <= tau then
  remaining = idiv(tau - (t - r), I) + 1
end
if not check then
  if new then
    store(key, 0 - (now - origin), 'o', int(origin), 't', '0')
  end
  return {0, remaining, 0, 0}
end
return {0, remaining, last - tau - r + lag, 0}
