-- gcra and leaky-bucket (ARGV[8] = '1'): the theoretical arrival time `t`.
-- With I = floor(W / L) and tau = I * (L - 1) <= W, the TAT stays within
-- one window past the latest `now`, below 2^52 + 2^50.
local leaky = ARGV[8] == '1'
local state = redis.call('HMGET', key, 'o', 't')
local origin = tonumber(state[1])
local new = origin == nil
local tat = 0
if new then
  origin = now
else
  tat = tonumber(state[2])
end
local r, lag = since(origin)
local I = idiv(W, L)
local tau = I * (L - 1)

local function remaining_at(schedule)
  local ahead = math.max(schedule, r) - r
  if ahead <= tau then
    return idiv(tau - ahead, I) + 1
  end
  return 0
end

-- Empty once the TAT is not ahead of `now`: from then on max(TAT, now) = now,
-- exactly as for a new client (gcra has no grid).
local function ttl(schedule)
  return schedule - (now - origin)
end

if not check then
  if new then
    store({'o', int(origin), 't', '0'}, ttl(0))
  end
  return {0, remaining_at(tat), 0, 0}
end
-- The last of the `cost` single requests is at t + (cost - 1) * I; the
-- admission moves the TAT on by cost * I <= L * I <= W.
local t = math.max(tat, r)
local last = t + (cost - 1) * I
if last - r <= tau then
  local delay = 0
  if leaky then
    delay = t - r + lag
  end
  tat = t + cost * I
  store({'o', int(origin), 't', int(tat)}, ttl(tat))
  return {1, remaining_at(tat), 0, delay}
end
return {0, remaining_at(tat), last - tau - r + lag, 0}
