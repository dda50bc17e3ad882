-- sliding-window: the times of the last (at most L) admissions, oldest
-- first, in a ring of hash fields `0` .. `L-1`: `n` of them are used, the
-- oldest at slot `h`. Times are sorted (each is judged no earlier than the
-- newest before it); time + W <= 2^52 + 2^50.
local state = redis.call('HMGET', key, 'o', 'n', 'h')
local origin = tonumber(state[1])
local new = origin == nil
local n, head = 0, 0
if new then
  origin = now
else
  n = tonumber(state[2])
  head = tonumber(state[3])
end
local r, lag = since(now, origin)

-- The k-th oldest kept admission, k in 0 .. n - 1.
local function kept(k)
  return tonumber(redis.call('HGET', key, int((head + k) % L)))
end

-- Judged no earlier than the newest admission, so that the ring stays
-- sorted and an early `now` cannot see a window with fewer admissions.
local at = r
if n > 0 then
  at = max(r, kept(n - 1))
end
-- The kept admissions that have left the window at `at` (t + W <= at) come
-- first: binary search for the first one still in it.
local low, high = 0, n
while low < high do
  local middle = floor((low + high) / 2)
  if kept(middle) + W <= at then
    low = middle + 1
  else
    high = middle
  end
end
local used = n - low

if refunding then
  -- g of the kept admissions at the refund's time leave the log: the ring
  -- is rewritten from slot 0 without them (O(L), a refund's cost only).
  local a = refunding - origin
  if new or now - refunding >= W or a < 0 or a + W <= at then
    return {0}
  end
  local times, g = {}, 0
  for k = 0, n - 1 do
    local t = kept(k)
    if t == a and g < cost then
      g = g + 1
    else
      times[#times + 1] = t
    end
  end
  if g == 0 then
    return {0}
  end
  local newest = times[#times]
  if newest == nil or newest + W <= at then
    redis.call('DEL', key)
    return {g}
  end
  local fields = {}
  for k = 1, #times do
    fields[#fields + 1] = int(k - 1)
    fields[#fields + 1] = int(times[k])
    if #fields >= 2000 then
      hset(key, unpack(fields))
      fields = {}
    end
  end
  fields[#fields + 1] = 'o'
  fields[#fields + 1] = int(origin)
  fields[#fields + 1] = 'n'
  fields[#fields + 1] = int(#times)
  fields[#fields + 1] = 'h'
  fields[#fields + 1] = '0'
  rewrite(key, newest + W - (now - origin), unpack(fields))
  return {g}
end

-- Empty once the newest admission has left the window; the log has no
-- grid, so from then on it answers exactly as a new client.
local function ttl(newest)
  return newest + W - (now - origin)
end

if not check then
  if new then
    store(key, 0, 'o', int(origin), 'n', '0', 'h', '0')
  end
  return {0, L - used, 0, 0}
end
if used + cost <= L then
  -- `cost` admissions at `at`, one slot each, written in batches (Lua's
  -- unpack takes a few thousand values at most).
  local fields = {}
  for _ = 1, cost do
    local slot
    if n == L then
      slot = head
      head = (head + 1) % L
    else
      slot = (head + n) % L
      n = n + 1
    end
    fields[#fields + 1] = int(slot)
    fields[#fields + 1] = int(at)
    if #fields >= 2000 then
      hset(key, unpack(fields))
      fields = {}
    end
  end
  fields[#fields + 1] = 'o'
  fields[#fields + 1] = int(origin)
  fields[#fields + 1] = 'n'
  fields[#fields + 1] = int(n)
  fields[#fields + 1] = 'h'
  fields[#fields + 1] = int(head)
  store(key, ttl(at), unpack(fields))
  return {1, L - used - cost, 0, 0}
end
-- With the `used` times in the window in order, the k-th oldest
-- (k = used + cost - L) leaving makes room for all `cost`, at its time
-- plus W.
return {0, L - used, kept(low + used + cost - L - 1) + W - r + lag, 0}
