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
-- `judge`: the time the window is judged at. A leasing limiter (TERM > 0,
-- the contract's "A limit shared by many instances") writes its
-- admissions at `r + TERM`, when the lease that spends them has ended, so
-- the log may hold times later than `r`: they all count (they are units
-- out), and the window is judged at `r` itself, never later, so that no
-- entry leaves it early.
local judge = at
if TERM > 0 then
  judge = r
  at = max(r + TERM, at)
end
-- The kept admissions that have left the window at `judge` (t + W <=
-- judge) come first: binary search for the first one still in it.
local low, high = 0, n
while low < high do
  local middle = floor((low + high) / 2)
  if kept(middle) + W <= judge then
    low = middle + 1
  else
    high = middle
  end
end
local used = n - low

if refunding then
  -- g of the kept admissions at the refund's time leave the log. The
  -- times are sorted, so the block at `a` is found by binary search, and
  -- only the shorter side of the ring moves over the gap: the older live
  -- entries or the newer ones (the entries that have left the window, the
  -- first `low`, are dropped for free: they answer nothing). A refund of
  -- a recent admission, the usual one, touches O(g) fields; the most one
  -- can move is half the live entries.
  -- A leasing limiter's admissions are in the log at their lease's end.
  local a = refunding + TERM - origin
  if new or now - refunding >= W + TERM or a < 0 or a + W <= judge then
    return {0}
  end
  -- `first`: the oldest entry at or after `a` (entries at `a` are in the
  -- window, as a + W > at, so it is at least `low`).
  local first, high = low, n
  while first < high do
    local middle = floor((first + high) / 2)
    if kept(middle) < a then
      first = middle + 1
    else
      high = middle
    end
  end
  -- `last`: past the first `cost` entries at `a`.
  local last = first
  high = n
  if cost < n - first then
    high = first + cost
  end
  while last < high do
    local middle = floor((last + high) / 2)
    if kept(middle) <= a then
      last = middle + 1
    else
      high = middle
    end
  end
  local g = last - first
  if g == 0 then
    return {0}
  end
  local older, newer = first - low, n - last
  if older + newer == 0 then
    redis.call('DEL', key)
    return {g}
  end
  local newest
  if newer > 0 then
    newest = kept(n - 1)
  else
    newest = kept(first - 1)
  end
  -- Entries [from, to) of the kept ones move by `by` slots, read and
  -- written a chunk at a time (one HMGET and one HSET a chunk: a call
  -- into Redis per field would cost several times the move itself).
  -- Every slot a chunk writes was read already or holds a removed entry:
  -- moving up (by > 0), chunks go newest first and each writes above what
  -- it read; moving down, oldest first and below.
  local function move(from, to, by)
    local count, done = to - from, 0
    while done < count do
      local size = min(1000, count - done)
      local lo = from + done
      if by > 0 then
        lo = to - done - size
      end
      local names = {}
      for k = lo, lo + size - 1 do
        names[#names + 1] = int((head + k) % L)
      end
      local times = redis.call('HMGET', key, unpack(names))
      local fields = {}
      for i = 1, size do
        fields[#fields + 1] = int((head + lo + i - 1 + by) % L)
        fields[#fields + 1] = times[i]
      end
      redis.call('HSET', key, unpack(fields))
      done = done + size
    end
  end
  if older <= newer then
    move(low, first, g)
    head = (head + low + g) % L
  else
    move(last, n, -g)
    head = (head + low) % L
  end
  n = older + newer
  local fields = {}
  fields[#fields + 1] = 'o'
  fields[#fields + 1] = int(origin)
  fields[#fields + 1] = 'n'
  fields[#fields + 1] = int(n)
  fields[#fields + 1] = 'h'
  fields[#fields + 1] = int(head)
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
