-- The driver: the clock, and one decision per call or per key of a batch.
-- The policy's step above closed `decide`.

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

local op = ARGV[1]
if op == 'b' then
  local replies = {}
  for i = 1, #KEYS do
    -- At most L <= 2^32 - 1: exact.
    replies[i] = decide(KEYS[i], true, at(ARGV[2 * i]), tonumber(ARGV[2 * i + 1]))
  end
  return replies
end
-- A peek never creates state: with no key there is nothing to answer from,
-- and a step writes only for a new client (`new`), so a peek of an existing
-- key writes nothing either.
if op == 'p' and redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
return decide(KEYS[1], op == 'c', at(ARGV[2]), tonumber(ARGV[3]))
