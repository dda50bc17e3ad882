-- floodgate: the shared head of every policy script. A script call decides
-- for one client, or for a batch of clients one after another: Redis runs a
-- script alone, so each decision's read, step and write are atomic without
-- WATCH/MULTI or retries, and a batch is the same decisions sent one by one
-- with nothing between them.
--
-- KEYS     the clients' states, one key each: a hash whose field `o` is the
--          client's origin (the `now` of its first call) and whose other
--          fields are the policy's state, every time in it counted from `o`.
-- ARGV[1]  `c` decide one request of KEYS[1] (check), `r` remaining, `p`
--          peek: as `r` for a key that exists, nil for one that does not;
--          `b` a batch: decide one request of each key, in order
-- ARGV[2]  now in ticks, or empty: the script reads Redis TIME in
--          microseconds (then one tick is one microsecond)
-- ARGV[3]  the request's cost n for `c`, 1 <= n <= L (the caller answers a
--          cost of 0 or above L from `r`): admitted iff n single requests
--          at `now` would all be, then the state they would leave
-- ARGV[2i], ARGV[2i + 1]  `b` only: the now (or empty) and the cost of the
--          decision for KEYS[i], as ARGV[2] and ARGV[3] for `c`
--
-- The limiter's constants come before this head, as literals (one script
-- per policy and constants, so that a call carries only its own
-- arguments): L the limit, W the window in ticks, ms_per_tick the
-- milliseconds per tick (1 when a tick is a millisecond or less),
-- ticks_per_ms the ticks per millisecond (1 when a tick is a millisecond
-- or more), min_ttl the least TTL in milliseconds given to a state that is
-- written, leaky (gcra.lua only) whether to answer the queueing delay, and
-- MAX_TTL the longest TTL set, 2^46 ms (2,230 years): far past any state's
-- use, and small enough that the product in `store` is compared before it
-- can lose precision.
--
-- Returns {allowed (0/1), remaining, retry_after, delay}; `remaining` and
-- `peek` calls return {0, remaining, 0, 0}, and a `peek` of a key that does
-- not exist returns nil. A batch returns one such reply per key, in order.
--
-- Arithmetic. Lua numbers here are doubles: every integer below 2^53 is
-- exact, and so is every sum, difference and product whose exact value stays
-- below 2^53. The caller refuses a `now` above 2^52, a window above 2^50 and,
-- for sliding-window-counter, L * W above 2^52; under those bounds every
-- value each script computes stays within 2^53 (each script says why where
-- it multiplies). Numbers handed to Redis are formatted with %d, never with
-- tostring, whose %.14g would round times of 15 digits and more.
--
-- Layout: the constants, this head (the helpers every decision of the call
-- shares), then `decide` (the policy's step, which ends by returning the
-- reply), then `driver.lua`, which reads the clock and calls `decide` once
-- or once per key.

local floor, max, min, format = math.floor, math.max, math.min, string.format


-- floor(a / b) for integers 0 <= a < 2^53 and b >= 1. The double quotient
-- is already exact in that range; the corrections make that independent of
-- the argument.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function int(x)
  return format('%d', x)
end

-- A call at `now` of the client whose origin is `origin`: its time relative
-- to the origin (judged at the origin when `now` is earlier: a call that
-- raced the one creating the client), and how much earlier than the origin
-- the call is (added to its retry_after, and to a leaky bucket's delay).
local function since(now, origin)
  local r = now - origin
  if r < 0 then
    return 0, -r
  end
  return r, 0
end

-- Writes the state `...` (field/value pairs) of `key` with a TTL of `ticks`
-- converted to milliseconds, rounded up and at least `min_ttl`. `ticks` is
-- how long the state still answers differently from an empty one. When
-- neither it nor `min_ttl` is positive the state is not worth keeping and
-- nothing is written: that happens only for the state a `remaining` call
-- creates for a new client (an admission always leaves a positive TTL), so
-- there is no older key to delete.
--
-- The helpers are defined once per call, not per decision: a closure made
-- for each decision of a batch is an allocation each.
local function store(key, ticks, ...)
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
  redis.call('HSET', key, ...)
  redis.call('PEXPIRE', key, int(ms))
end

-- One decision: a request of cost `cost` (1 <= cost <= L, an exact
-- integer) of the client whose state is `key` at `now`, if `check`; else its
-- remaining. Returns the reply (the policy's step ends in its `return`).
local function decide(key, check, now, cost)
