-- token-bucket: `t` tokens once the drips up to index `d` (at d * I) are
-- counted. Drips fall on the client's own grid, origin + k * I.
local state = redis.call('HMGET', key, 'o', 't', 'd')
local origin = tonumber(state[1])
local new = origin == nil
local tokens, drips = L, 0
if new then
  origin = now
else
  tokens = tonumber(state[2])
  drips = tonumber(state[3])
end
local r, lag = since(now, origin)
local I = idiv(W, L)

-- The bucket at r: every drip not yet counted is added, up to L. An `r`
-- before the last counted drip adds nothing. due <= r < 2^52.
local available, counted = tokens, drips
local due = idiv(r, I)
if due > drips then
  available = min(tokens + (due - drips), L)
  counted = due
end

if refunding then
  if new or now - refunding >= W then
    return {0}
  end
  -- g = min(n, L - tokens(r)) tokens back.
  local g = min(cost, L - available)
  if g > 0 then
    tokens = available + g
    drips = counted
    rewrite(key, (drips + L - tokens) * I - (now - origin),
      'o', int(origin), 't', int(tokens), 'd', int(drips))
  end
  return {g}
end

-- A state (t, d) is full again at drip d + (L - t): its TTL is
-- (d + L - t) * I - (now - origin). From then on it answers as a new
-- client's bucket would, except that its drips keep the old grid.
-- (d + L - t) * I is at most r + W.

if not check then
  if new then
    store(key, (L - tokens) * I - (now - origin), 'o', int(origin), 't', int(tokens), 'd', '0')
  end
  return {0, available, 0, 0}
end
if available >= cost then
  tokens = available - cost
  drips = counted
  store(key, (drips + L - tokens) * I - (now - origin),
    'o', int(origin), 't', int(tokens), 'd', int(drips))
  return {1, tokens, 0, 0}
end
-- The (cost - available)-th drip after the last counted one fills it to
-- `cost`: (counted + cost - available) * I <= r + L * I <= r + W.
return {0, available, (counted + cost - available) * I - r + lag, 0}
