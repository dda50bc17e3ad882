-- sliding-window-counter: `c` admissions in window `i` and `p` in window
-- i - 1, on the fixed-window grid. The caller keeps L * W <= 2^52, so each
-- product below (p * (W - e), L * W) is at most 2^52; those with the cost
-- n <= L, m = n - 1 ((c + m) * W, (p + c + m - L) * W) are below 2^53, and
-- so is every sum or difference of two of them: all exact.
local state = redis.call('HMGET', key, 'o', 'i', 'p', 'c')
local origin = tonumber(state[1])
local new = origin == nil
local index, previous, current = 0, 0, 0
if new then
  origin = now
else
  index = tonumber(state[2])
  previous = tonumber(state[3])
  current = tonumber(state[4])
end
local r, lag = since(now, origin)

-- The counts as seen at r, rolled forward by the windows that have passed;
-- an r before the stored window is judged at that window's start (e = 0),
-- where the weighted count is highest.
local at_index, p, c, e = index, previous, current, 0
local now_index = idiv(r, W)
if now_index >= index then
  at_index = now_index
  e = r - now_index * W
  if now_index - index == 1 then
    p, c = current, 0
  elseif now_index - index >= 2 then
    p, c = 0, 0
  end
end

if refunding then
  -- Back to the count of the window that holds the admission: the
  -- current one, or the one before it.
  local a = refunding - origin
  if new or now - refunding >= W or a < 0 then
    return {0}
  end
  local admitted = idiv(a, W)
  local g = 0
  if admitted == at_index then
    g = min(cost, c)
    c = c - g
  elseif admitted + 1 == at_index then
    g = min(cost, p)
    p = p - g
  end
  if g > 0 then
    local ttl_ = 0
    if c > 0 then
      ttl_ = (at_index + 2) * W - (now - origin)
    elseif p > 0 then
      ttl_ = (at_index + 1) * W - (now - origin)
    end
    rewrite(key, ttl_, 'o', int(origin), 'i', int(at_index), 'p', int(p), 'c', int(c))
  end
  return {g}
end

local function room(c_)
  return L * W - p * (W - e) - c_ * W
end

-- max(0, ceil(room / W)); room + W - 1 <= L * W + W.
local function remaining_with(c_)
  local free = room(c_)
  if free <= 0 then
    return 0
  end
  return idiv(free + W - 1, W)
end

-- Empty (on its grid) once no window it counts can weigh any more: two
-- windows after one with admissions starts, one window after one whose
-- predecessor alone had admissions.
local function ttl(i, p_, c_)
  if c_ > 0 then
    return (i + 2) * W - (now - origin)
  elseif p_ > 0 then
    return (i + 1) * W - (now - origin)
  end
  return 0
end

if not check then
  if new then
    store(key, ttl(0, 0, 0), 'o', int(origin), 'i', '0', 'p', '0', 'c', '0')
  end
  return {0, remaining_with(c), 0, 0}
end
-- The last of the `cost` single requests: c + m with m = cost - 1.
local m = cost - 1
if room(c + m) > 0 then
  if lease_until then
    -- A lease's units count in window `at_index` alone: it ends with it.
    lease_until = min(lease_until, (at_index + 1) * W - (now - origin))
  end
  store(key, ttl(at_index, p, c + cost),
    'o', int(origin), 'i', int(at_index), 'p', int(p), 'c', int(c + cost))
  return {1, remaining_with(c + cost), 0, 0}
end

-- The first admitted instant: within this window at offset
-- floor((p + c + m - L) * W / p) + 1 if that is below W (p > 0); else in
-- the next window (counts (c, 0)) at its start if c + m < L, else at
-- floor((c + m - L) * W / c) + 1 if that is below W; else at the start of
-- the window after, (0, 0). start + 2W <= r + 2W < 2^53.
local start = at_index * W
local first
if p > 0 then
  local f = idiv((p + c + m - L) * W, p) + 1
  if f < W then
    first = start + f
  end
end
if first == nil then
  if c + m < L then
    first = start + W
  else
    local f = idiv((c + m - L) * W, c) + 1
    if f < W then
      first = start + W + f
    else
      first = start + 2 * W
    end
  end
end
return {0, remaining_with(c), first - r + lag, 0}
