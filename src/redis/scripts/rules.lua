-- Several rules on one client (the contract's "Several limits on one
-- client"): every rule's step runs with its writes held; they are made
-- only if every rule admitted, so a request that any rule refuses changes
-- no rule's state. Each rule's step is the one it runs alone, on its own
-- key, so each behaves exactly as it would alone.
local function decide(first, check, now, cost)
  if not check then
    -- A new rule's state is written as alone (unless a peek holds it).
    local remaining
    for j = 1, K do
      local left = steps[j](KEYS[first + j - 1], false, now, cost)[2]
      if remaining == nil or left < remaining then
        remaining = left
      end
    end
    return {0, remaining, 0, 0, 0}
  end
  held = {}
  local admitted = true
  -- `after`: the least remaining after the request, if admitted;
  -- `before`: the least remaining at `now` without it. A rule that admits
  -- answers its remaining after the request, which is its remaining
  -- before less the cost (an admission is n single ones).
  local after, before, wait, delay, refused_by
  for j = 1, K do
    local reply = steps[j](KEYS[first + j - 1], true, now, cost)
    local left = reply[2]
    if after == nil or left < after then
      after = left
    end
    if reply[1] == 1 then
      left = left + cost
      if delay == nil or reply[4] > delay then
        delay = reply[4]
      end
    else
      admitted = false
      -- The longest wait, by the first rule that waits it.
      if wait == nil or reply[3] > wait then
        wait = reply[3]
        refused_by = j - 1
      end
    end
    if before == nil or left < before then
      before = left
    end
  end
  local writes = held
  held = nil
  if admitted then
    release(writes)
    return {1, after, 0, delay, 0}
  end
  return {0, before, wait, 0, refused_by}
end

-- Each rule's own answer to a request of cost `cost` at `now` that the
-- limiter decided (`decided` whether it admitted it), from the states as
-- they are now; nothing is written. Per rule, in order: its remaining now,
-- and, when it is asked (a cost within its limit, of a request the limiter
-- refused), whether it alone would admit the request, its retry_after and
-- its delay; 0 for those otherwise.
local function answers(first, now, cost, decided)
  held = {}
  local reply = {}
  for j = 1, K do
    local key = KEYS[first + j - 1]
    local left = steps[j](key, false, now, 1)[2]
    local own = {0, 0, 0, 0}
    if cost >= 1 and cost <= limits[j] and not decided then
      own = steps[j](key, true, now, cost)
    end
    reply[#reply + 1] = left
    reply[#reply + 1] = own[1]
    reply[#reply + 1] = own[3]
    reply[#reply + 1] = own[4]
  end
  held = nil
  return reply
end
