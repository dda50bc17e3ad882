-- fixed-window: `c` admissions in window `i`, [i * W, (i + 1) * W) past the
-- origin. (i + 1) * W <= r + W.
local state = redis.call('HMGET', key, 'o', 'i', 'c')
local origin = tonumber(state[1])
local new = origin == nil
local index, count = 0, 0
if new then
  origin = now
else
  index = tonumber(state[2])
  count = tonumber(state[3])
end
local r, lag = since(now, origin)
local current = idiv(r, W)
if refunding then
  -- Back to the window that holds r only, for an admission in it (one
  -- before the origin is in no window of this state).
  local a = refunding - origin
  if new or now - refunding >= W or a < 0 or current > index or idiv(a, W) ~= index then
    return {0}
  end
  local g = min(cost, count)
  if g > 0 then
    rewrite(key, (index + 1) * W - (now - origin),
      'o', int(origin), 'i', int(index), 'c', int(count - g))
  end
  return {g}
end

-- A state is empty (on its grid) once its window i ends: its TTL is
-- (i + 1) * W - (now - origin). A window with no admission is empty already.

if not check then
  if new then
    store(key, 0, 'o', int(origin), 'i', '0', 'c', '0')
  end
  if current > index then
    return {0, L, 0, 0}
  end
  return {0, L - count, 0, 0}
end
-- A time in an earlier window than the stored one is judged in the stored
-- one: it is full at least as often.
local window, used = index, count
if current > index then
  window, used = current, 0
end
if used + cost <= L then
  if lease_until then
    -- A lease's units count in this window alone: it ends with it.
    lease_until = min(lease_until, (window + 1) * W - r + lag)
  end
  store(key, (window + 1) * W - (now - origin),
    'o', int(origin), 'i', int(window), 'c', int(used + cost))
  return {1, L - used - cost, 0, 0}
end
return {0, L - used, (window + 1) * W - r + lag, 0}
