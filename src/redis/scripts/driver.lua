-- The driver: the clock, and one decision per call or per client of a
-- batch. `decide(first, check, now, cost)` above decides for the client
-- whose keys are KEYS[first .. first + K - 1].

-- Redis TIME in microseconds, read at most once per call: every decision of
-- a batch on Redis's clock is judged at the same instant, as if its
-- requests had arrived together.
local server_now
local function at(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  if server_now == nil then
    -- Needed before a write that follows TIME on Redis < 5 (it replicates
    -- the script's effects instead of the script). Redis 7, the first to
    -- define REDIS_VERSION_NUM, always does; skipping the call there saves
    -- a deprecated no-op on every decision.
    if redis.REDIS_VERSION_NUM == nil and redis.replicate_commands then
      redis.replicate_commands()
    end
    local time = redis.call('TIME')
    -- At most 2^52 µs until the year 2112.
    server_now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  return server_now
end

-- A check's reply with the time it was judged at as its sixth field (the
-- rule that refused, 0 for one rule, as its fifth): a refund names the
-- admission by that time, which on Redis's clock only the server knows.
local function stamped(reply, now)
  reply[5] = reply[5] or 0
  reply[6] = now
  return reply
end

local op = ARGV[1]
if op == 'b' then
  local replies = {}
  for i = 1, #KEYS / K do
    -- At most L <= 2^32 - 1: exact.
    local now = at(ARGV[2 * i])
    replies[i] = stamped(decide((i - 1) * K + 1, true, now, tonumber(ARGV[2 * i + 1])), now)
  end
  return replies
end
-- Each rule's own answer (several rules only): nothing is written.
if op == 'e' then
  return answers(1, at(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1')
end
-- A refund never creates state: with no key nothing was admitted; each
-- rule gives back on its own, and the answer is the least they gave.
if op == 'f' then
  if redis.call('EXISTS', unpack(KEYS)) == 0 then
    return 0
  end
  refunding = tonumber(ARGV[4])
  -- An admission later than Redis's clock (a caller's `at` from another
  -- clock, or clocks that raced) is judged at its own time.
  local now, cost = math.max(at(ARGV[2]), refunding), tonumber(ARGV[3])
  local given
  for j = 1, K do
    -- An `in-flight` rule answers nothing: it is left out.
    local g = steps[j](KEYS[j], true, now, cost)[1]
    if g ~= nil and (given == nil or g < given) then
      given = g
    end
  end
  return given or 0
end
-- A release (`in-flight` rules) never creates state: a key with no holder
-- does not exist, and each rule lets go on its own; the answer is the
-- least they released.
if op == 'l' then
  local now, n = at(ARGV[2]), tonumber(ARGV[3])
  local released
  for j = 1, K do
    if holds[j] then
      local r = let_go(KEYS[j], now, n, 4)
      if released == nil or r < released then
        released = r
      end
    end
  end
  return released or 0
end
-- A renewal of this process's holders' leases: how many are still held
-- (by the first `in-flight` rule's key; every such rule holds the same).
if op == 'w' then
  local now = at(ARGV[2])
  local kept
  for j = 1, K do
    if holds[j] then
      local k = renew(KEYS[j], now, 3)
      kept = kept or k
    end
  end
  return kept or 0
end
-- A lease (the contract's "A limit shared by many instances"): the most
-- asked for that leaves most of what is left to the others, all or
-- nothing in every rule, as one admission of that cost; the cost alone if
-- that is refused. The grant and the term follow the check's reply.
if op == 'g' then
  local now, cost, ask = at(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local grant = cost
  if ask > cost then
    -- What is left now, read with the writes a new client's state asks
    -- for held and dropped (the admission below makes them).
    held = {}
    local left = decide(1, false, now, 1)[2]
    held = nil
    grant = max(cost, min(ask, floor((left - cost) / SHARE) + cost))
  end
  lease_until = TERM
  local reply = decide(1, true, now, grant)
  if reply[1] == 0 and grant > cost then
    grant = cost
    lease_until = TERM
    reply = decide(1, true, now, grant)
  end
  reply = stamped(reply, now)
  if reply[1] == 0 then
    grant = 0
  end
  reply[7] = grant
  reply[8] = lease_until
  return reply
end
if op == 'c' and ARGV[4] then
  holder = ARGV[4]
end
-- A peek never creates state: with no key there is nothing to answer from,
-- and the writes a step asks for (a new rule's state, when another rule's
-- key exists) are held and dropped.
if op == 'p' then
  if redis.call('EXISTS', unpack(KEYS)) == 0 then
    return false
  end
  held = {}
end
local now = at(ARGV[2])
return stamped(decide(1, op == 'c', now, tonumber(ARGV[3])), now)
