-- Units in flight (the contract's "Requests in flight"). An `in-flight`
-- rule's key is a sorted set of the client's holders: one member
-- `<units>:<id>` per admission still held, scored by the tick at which its
-- lease ends (LEASE ticks after its admission or its last renewal; 2^53,
-- later than any time, without leases). A holder whose lease has ended
-- holds nothing: its units came back then, so a process that died holding
-- units gives them back within one lease. `holds[j]` is true for the
-- rules that are `in-flight` rules; `holder` is the id of the admission a
-- check (`c`) would hold, from the caller (unique per admission).

-- A refusal no wait ends (only a release): larger than any wait a rate
-- rule answers, so the several-rules `decide` keeps it as the longest, and
-- read back as `decision::NEVER`.
local NEVER_WAIT = 9007199254740992
local NO_LEASE_END = 9007199254740992
local holds = {}
local holder

local function units_of(member)
  return tonumber(string.match(member, '^(%d+):'))
end

-- The units the holders of `key` whose leases run past `now` hold.
local function held_units(key, now)
  local live = redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf')
  local h = 0
  for i = 1, #live do
    h = h + units_of(live[i])
  end
  return h
end

local function lease_end(now)
  if LEASE == 0 then
    return NO_LEASE_END
  end
  return now + LEASE
end

-- The key lives as long as its latest lease (for ever without leases:
-- its last release empties it, and Redis deletes an empty set).
local function keep(key)
  if LEASE == 0 then
    redis.call('PERSIST', key)
    return
  end
  -- As `write` converts ticks: rounded up, at most MAX_TTL (LEASE is at
  -- most 2^50 ticks, so the product is compared before it loses
  -- precision).
  local ms = MAX_TTL
  if LEASE < MAX_TTL / ms_per_tick then
    ms = idiv(LEASE * ms_per_tick + ticks_per_ms - 1, ticks_per_ms) + 1
  end
  redis.call('PEXPIRE', key, int(ms))
end

-- Adds the holder `member` to `key` at `now`, dropping the holders whose
-- leases ended.
local function put(key, member, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
  redis.call('ZADD', key, int(lease_end(now)), member)
  keep(key)
end

-- Holds `cost` units of `key` for the admission `holder` (held back while
-- `held` is set: a write of several rules' decision, or a peek's).
local function hold(key, now, cost)
  local member = int(cost) .. ':' .. holder
  if held then
    held[#held + 1] = {key, true, put, member, now}
    return
  end
  put(key, member, now)
end

-- Takes up to `wanted` units from the holder `member` of `key` (score
-- `score`, a string as Redis gave it), if its lease runs past `now`: the
-- units taken. The rest of a holder taken in part stays, renamed.
local function take(key, member, score, now, wanted)
  redis.call('ZREM', key, member)
  if tonumber(score) <= now then
    return 0
  end
  local units, id = string.match(member, '^(%d+):(.*)$')
  units = tonumber(units)
  local taken = min(wanted, units)
  if taken < units then
    redis.call('ZADD', key, score, int(units - taken) .. ':' .. id)
  end
  return taken
end

-- Releases up to `n` units of `key`: from the holders named in
-- ARGV[first..] (the caller's own admissions), or, when it names none,
-- from the live holders whose leases end first. The units released.
local function let_go(key, now, n, first)
  local released = 0
  if #ARGV >= first then
    for i = first, #ARGV do
      if released >= n then
        break
      end
      local score = redis.call('ZSCORE', key, ARGV[i])
      if score then
        released = released + take(key, ARGV[i], score, now, n - released)
      end
    end
    return released
  end
  local live = redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf', 'WITHSCORES')
  for i = 1, #live, 2 do
    if released >= n then
      break
    end
    released = released + take(key, live[i], live[i + 1], now, n - released)
  end
  return released
end

-- Moves the leases of the holders named in ARGV[first..] whose leases run
-- past `now` to end LEASE ticks after `now`: the holders still held. A
-- holder whose lease ended is not brought back.
local function renew(key, now, first)
  local kept = 0
  for i = first, #ARGV do
    local score = redis.call('ZSCORE', key, ARGV[i])
    if score and tonumber(score) > now then
      redis.call('ZADD', key, 'XX', int(lease_end(now)), ARGV[i])
      kept = kept + 1
    end
  end
  if kept > 0 then
    keep(key)
  end
  return kept
end
