-- floodgate: the shared head of every policy script. One script call is one
-- decision for one client: Redis runs a script alone, so the read, the step
-- and the write are atomic without WATCH/MULTI or retries.
--
-- KEYS[1]  the client's state: a hash whose field `o` is the client's origin
--          (the `now` of its first call) and whose other fields are the
--          policy's state, every time in it counted from `o`.
-- ARGV[1]  `c` decide one request (check), `r` remaining, `p` peek: as `r`
--          for a key that exists, nil for one that does not
-- ARGV[2]  now in ticks, or empty: the script reads Redis TIME in
--          microseconds (then one tick is one microsecond)
-- ARGV[3]  L, the limit
-- ARGV[4]  W, the window in ticks
-- ARGV[5]  milliseconds per tick (1 when a tick is a millisecond or less)
-- ARGV[6]  ticks per millisecond (1 when a tick is a millisecond or more)
-- ARGV[7]  the least TTL in milliseconds given to a state that is written
-- ARGV[8]  gcra.lua only: `1` for leaky-bucket (answer the queueing delay)
-- ARGV[9]  the request's cost n for `c`, 1 <= n <= L (the caller answers a
--          cost of 0 or above L from `r`): admitted iff n single requests
--          at `now` would all be, then the state they would leave
--
-- Returns {allowed (0/1), remaining, retry_after, delay}; `remaining` and
-- `peek` calls return {0, remaining, 0, 0}, and a `peek` of a key that does
-- not exist returns nil.
--
-- Arithmetic. Lua numbers here are doubles: every integer below 2^53 is
-- exact, and so is every sum, difference and product whose exact value stays
-- below 2^53. The caller refuses a `now` above 2^52, a window above 2^50 and,
-- for sliding-window-counter, L * W above 2^52; under those bounds every
-- value each script computes stays within 2^53 (each script says why where
-- it multiplies). Numbers handed to Redis are formatted with %d, never with
-- tostring, whose %.14g would round times of 15 digits and more.

local key = KEYS[1]
local check = ARGV[1] == 'c'
-- A peek never creates state: with no key there is nothing to answer from,
-- and the step below writes only for a new client (`new`), so a peek of an
-- existing key writes nothing either.
if ARGV[1] == 'p' and redis.call('EXISTS', key) == 0 then
  return false
end
local now
if ARGV[2] == '' then
  -- Needed before a write that follows TIME on Redis < 5 (it replicates
  -- the script's effects instead of the script). Redis 7, the first to
  -- define REDIS_VERSION_NUM, always does; skipping the call there saves
  -- a deprecated no-op on every decision.
  if redis.REDIS_VERSION_NUM == nil and redis.replicate_commands then
    redis.replicate_commands()
  end
  local time = redis.call('TIME')
  -- At most 2^52 µs until the year 2112.
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[2])
end
local L = tonumber(ARGV[3])
local W = tonumber(ARGV[4])
local ms_per_tick = tonumber(ARGV[5])
local ticks_per_ms = tonumber(ARGV[6])
local min_ttl = tonumber(ARGV[7])
-- At most L <= 2^32 - 1: exact.
local cost = tonumber(ARGV[9])

-- The longest TTL set, 2^46 ms (2,230 years): far past any state's use, and
-- small enough that the product below is compared before it can lose
-- precision.
local MAX_TTL = 70368744177664

-- floor(a / b) for integers 0 <= a < 2^53 and b >= 1. The double quotient
-- is already exact in that range; the corrections make that independent of
-- the argument.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function int(x)
  return string.format('%d', x)
end

-- The client's origin, its time relative to it (judged at the origin when
-- `now` is earlier: a call that raced the one creating the client), and how
-- much earlier than the origin the call is (added to its retry_after, and to
-- a leaky bucket's delay).
local function since(origin)
  local r = now - origin
  if r < 0 then
    return 0, -r
  end
  return r, 0
end

-- Writes the state `fields` (a flat field/value list) with a TTL of
-- `ticks` converted to milliseconds, rounded up and at least `min_ttl`.
-- `ticks` is how long the state still answers differently from an empty
-- one. When neither it nor `min_ttl` is positive the state is not worth
-- keeping and nothing is written: that happens only for the state a
-- `remaining` call creates for a new client (an admission always leaves a
-- positive TTL), so there is no older key to delete.
local function store(fields, ticks)
  local ms = 0
  if ticks > 0 then
    if ticks >= MAX_TTL / ms_per_tick then
      ms = MAX_TTL
    else
      -- ticks * ms_per_tick < 2^46; ticks + ticks_per_ms < 2^53.
      ms = idiv(ticks * ms_per_tick + ticks_per_ms - 1, ticks_per_ms)
    end
  end
  if ms < min_ttl then
    ms = min_ttl
  end
  if ms <= 0 then
    return
  end
  redis.call('HSET', key, unpack(fields))
  redis.call('PEXPIRE', key, int(ms))
end

