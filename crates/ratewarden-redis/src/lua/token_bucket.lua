-- Token bucket: the state is a hash {u = tokens used, l = when the next refill counts from}.
-- ARGV[4] refill interval per token (µs), ARGV[5] capacity.
local interval, capacity

configure = function()
  interval = ARGV[4]
  capacity = ARGV[5]
end

-- `units` left at `at`.
seed = function(at, units)
  local used = at_least_zero(capacity - units)
  redis.call('HSET', key, 'u', used, 'l', at)
  expire_at(at + used * interval)
end

-- Spent at `at` (never less spent than it is).
spend = function(at)
  local ok, last = pcall(function() return number(redis.call('HGET', key, 'l') or 0) end)
  if not ok or last < at then
    last = at
  end
  redis.call('DEL', key)
  redis.call('HSET', key, 'u', capacity, 'l', last)
  expire_at(last + capacity * interval)
end

-- `used` less the tokens refilled from `last` to now (at or after `last`), and when the next
-- refill counts from.
local function refilled(used, last)
  local tokens = idiv(now - last, interval)
  if tokens >= used then
    return 0, now
  end
  return used - tokens, last + tokens * interval
end

-- Puts back the tokens not refilled since the charge; refunded later than the charge, restarts
-- the refill in progress now.
refund = function(cost, charged_at)
  local state = redis.call('HMGET', key, 'u', 'l')
  if not state[1] then
    return
  end
  local used, last = number(state[1]), number(state[2])
  if used > capacity then
    used = capacity
  end
  if now < last then
    last = now
  else
    used, last = refilled(used, last)
  end
  local since = idiv(at_least_zero(now - charged_at), interval)
  used = at_least_zero(used - at_least_zero(cost - since))
  if now > charged_at and last < now then
    last = now
  end
  redis.call('HSET', key, 'u', used, 'l', last)
  expire_at(last + used * interval)
end

decide = function(cost, write)
  local state = redis.call('HMGET', key, 'u', 'l')
  local used, last = 0, 0
  if state[1] then
    used = number(state[1])
    last = number(state[2])
  elseif absent_spent then
    return unseeded()
  end
  -- Pulled back: behind a clock that stepped back, or past the capacity (which only a lying
  -- store could hold). A key spent until its split ends is ahead by at most the split's
  -- slack, and stays so.
  local pulled_back = last > now + split_slack or used > capacity
  if used > capacity then
    used = capacity
  end
  if last > now + split_slack then
    -- The clock stepped back: count refills from now on, not from a time to come.
    last = now + split_slack
  elseif now > last then
    used, last = refilled(used, last)
  end
  local remaining = at_least_zero(capacity - used)
  if write and pulled_back then
    put('HSET', key, 'u', used, 'l', last)
    expire_at(last + used * interval)
  end
  if cost > capacity then
    return {2, capacity, remaining, at_least_zero(last + used * interval - now), 0}
  end
  if cost <= remaining then
    used = used + cost
    local full_at = last + used * interval
    if write and cost > 0 then
      put('HSET', key, 'u', used, 'l', last)
      expire_at(full_at)
    end
    return {1, capacity, remaining - cost, at_least_zero(full_at - now), 0}
  end
  local allowed_at = last + (used + cost - capacity) * interval
  return {0, capacity, remaining, at_least_zero(last + used * interval - now), at_least_zero(allowed_at - now)}
end
