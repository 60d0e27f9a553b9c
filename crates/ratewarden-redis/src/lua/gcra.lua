-- GCRA: the state is the theoretical arrival time (a string). ARGV[4] emission interval (µs),
-- ARGV[5] burst.
local interval, limit

configure = function()
  interval = ARGV[4]
  limit = ARGV[5]
end

-- `units` left at `at`.
seed = function(at, units)
  local tat = at + interval * at_least_zero(limit - units)
  redis.call('SET', key, tat, 'PX', ttl_ms(tat))
end

-- Spent at `at` (never less spent than it is).
spend = function(at)
  local ok, stored = pcall(function() return number(redis.call('GET', key) or 0) end)
  local tat = at + interval * limit
  if ok and stored > tat then
    tat = stored
  end
  redis.call('SET', key, tat, 'PX', ttl_ms(tat))
end

-- Moves the TAT back by what of the charge's emission time lies after now.
refund = function(cost, charged_at)
  local stored = redis.call('GET', key)
  if not stored then
    return
  end
  local give = at_least_zero(cost * interval - at_least_zero(now - charged_at))
  if give > 0 then
    local tat = at_least_zero(number(stored) - give)
    redis.call('SET', key, tat, 'PX', ttl_ms(tat))
  end
end

decide = function(cost, write)
  local stored = redis.call('GET', key)
  local tat = 0
  local horizon = now + interval * limit
  if stored then
    tat = number(stored)
  elseif absent_spent then
    return unseeded()
  end
  -- A TAT past the horizon is a clock that stepped back: fully spent now, no more, and kept
  -- so (were it not written, every later check would find it spent again). A key spent until
  -- its split ends is ahead by at most the split's slack, and stays so.
  if tat > horizon + split_slack then
    tat = horizon + split_slack
    if write then
      put('SET', key, tat, 'PX', ttl_ms(tat))
    end
  end
  if tat < now then
    tat = now
  end
  if cost > limit then
    return {2, limit, idiv(at_least_zero(horizon - tat), interval), tat - now, 0}
  end
  local admitted, new_tat, remaining, reset_after, retry_after =
    gcra_step(tat, now, interval, limit, cost)
  if not admitted then
    return {0, limit, remaining, reset_after, retry_after}
  end
  if write and cost > 0 then
    put('SET', key, new_tat, 'PX', ttl_ms(new_tat))
  end
  return {1, limit, remaining, reset_after, 0}
end
