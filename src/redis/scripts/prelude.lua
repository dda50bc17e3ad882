-- floodgate: the shared head of every policy script. A script call decides
-- for one client, or for a batch of clients one after another: Redis runs a
-- script alone, so each decision's read, step and write are atomic without
-- WATCH/MULTI or retries, and a batch is the same decisions sent one by one
-- with nothing between them.
--
-- KEYS     the clients' states, K keys each (K the number of rules, one key
--          per rule, in the rules' order): a hash whose field `o` is the
--          client's origin for that rule (the `now` of its first call) and
--          whose other fields are the rule's state, every time in it
--          counted from `o`.
-- ARGV[1]  `c` decide one request of KEYS[1..K] (check), `r` remaining,
--          `p` peek: as `r` if any of the keys exists, nil if none does;
--          `b` a batch: decide one request of each client, in order;
--          `e` (several rules) each rule's own answer to a request that
--          was decided, writing nothing; `g` take a lease (below)
-- ARGV[2]  now in ticks, or empty: the script reads Redis TIME in
--          microseconds (then one tick is one microsecond)
-- ARGV[3]  the request's cost n for `c`, 1 <= n <= every rule's L (the
--          caller answers a cost of 0 or above a limit from `r`): admitted
--          iff n single requests at `now` would all be, then the state they
--          would leave
-- ARGV[4]  `e` only: 1 if the request was admitted, else 0 (ARGV[3] is
--          its cost, any; ARGV[2] its now); `c` of a limiter with
--          `in-flight` rules: the admission's holder id (held.lua); `f`:
--          the admission's time
-- `l`      (`in-flight` rules) release up to ARGV[3] units at ARGV[2], from
--          the holders named in ARGV[4..] or, with none named, from the
--          holders whose leases end first: the units released (the least
--          over the `in-flight` rules, 0 without one)
-- `w`      (`in-flight` rules) renew the leases of the holders named in
--          ARGV[3..] at ARGV[2]: how many are still held
-- `g`      a lease of a leasing limiter (TERM > 0): an admission of cost
--          ARGV[4] (the grant) at ARGV[2], where ARGV[3] <= ARGV[4] is the
--          caller's own cost; the grant is cut to the cost plus what is
--          left over it divided by SHARE, and to the cost alone if the
--          larger one is refused. Replies as `c`, with the grant (0 when
--          refused) and the lease's term in ticks from the call's time as
--          a seventh and eighth field
-- ARGV[2i], ARGV[2i + 1]  `b` only: the now (or empty) and the cost of the
--          decision for the i-th client, KEYS[(i - 1) * K + 1 .. i * K], as
--          ARGV[2] and ARGV[3] for `c`
--
-- The limiter's constants come before this head, as literals (one script
-- per set of rules and constants, so that a call carries only its own
-- arguments): K the number of rules, ms_per_tick the milliseconds per tick
-- (1 when a tick is a millisecond or less), ticks_per_ms the ticks per
-- millisecond (1 when a tick is a millisecond or more), min_ttl the least
-- TTL in milliseconds given to a state that is written, and MAX_TTL the
-- longest TTL set, 2^46 ms (2,230 years): far past any state's use, and
-- small enough that the product in `store` is compared before it can lose
-- precision. Each rule's step sees its own L the limit, W the window in
-- ticks, and leaky (gcra.lua only) whether to answer the queueing delay.
--
-- Returns {allowed (0/1), remaining, retry_after, delay}, and for several
-- rules a fifth field, the 0-based index of the rule that refused (0 when
-- admitted); `remaining` and `peek` calls return {0, remaining, 0, 0}
-- (and the fifth 0), and a `peek` of a client with no key returns nil. A
-- batch returns one such reply per client, in order; `e` returns four
-- fields per rule (see `answers` in rules.lua).
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
-- shares), then each rule's step as a function with that rule's L, W and
-- leaky (`steps[j]`, ending by returning the rule's reply), then `decide`
-- (the rule's step for one rule, `rules.lua` for several), then
-- `driver.lua`, which reads the clock and calls `decide` once or once per
-- client.

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

-- Writes held back while `held` is a table: a decision of several rules
-- runs every rule's step first and writes their states only once all of
-- them admitted; a peek writes nothing. Each held write is
-- {key, ticks or false, field/value pairs...}: `false` for fields alone,
-- whose TTL the `store` that follows them sets.
local held

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
local function write(key, ticks, ...)
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

-- A lease's term, in ticks from `now` (nil unless the call takes a lease,
-- ARGV[1] `g`): TERM to begin with, and each window rule's step that
-- admits lowers it to the end of the window its units count in (the
-- contract's "A limit shared by many instances").
local lease_until

-- A refund's admission time, in ticks (nil unless the call is a refund,
-- ARGV[1] `f`): each rule's step then gives back up to `cost` units of the
-- admission made then and returns {given}, the contract's "Giving units
-- back". A state a refund leaves empty is deleted, not written.
local refunding

-- `write` for a refund: the state, or no key when it is empty again (its
-- TTL not positive), which answers as it would.
local function rewrite(key, ticks, ...)
  if ticks <= 0 and min_ttl <= 0 then
    redis.call('DEL', key)
    return
  end
  write(key, ticks, ...)
end

-- `write`, or held while `held` is set.
local function store(key, ticks, ...)
  if held then
    held[#held + 1] = {key, ticks, ...}
    return
  end
  write(key, ticks, ...)
end

-- Fields of `key` written before the `store` that ends a step (a long run
-- of sliding-window slots), or held while `held` is set.
local function hset(key, ...)
  if held then
    held[#held + 1] = {key, false, ...}
    return
  end
  redis.call('HSET', key, ...)
end

-- Makes the held writes `writes`, in the order the steps asked for them.
local function release(writes)
  for i = 1, #writes do
    local w = writes[i]
    if w[2] == true then
      -- A holder's admission (held.lua): {key, true, put, member, now}.
      w[3](w[1], w[4], w[5])
    elseif w[2] then
      write(unpack(w))
    else
      redis.call('HSET', w[1], unpack(w, 3))
    end
  end
end

-- Each rule's step follows, as `steps[j](key, check, now, cost)`: one
-- decision of a request of cost `cost` (1 <= cost <= L, an exact integer)
-- of the client whose state for that rule is `key` at `now`, if `check`;
-- else its remaining. It returns the rule's reply (the policy's step ends
-- in its `return`).
