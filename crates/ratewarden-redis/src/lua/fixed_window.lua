-- Fixed window: the state is a hash {w = window index, c = cost admitted in it}.
-- ARGV[4] period (µs), ARGV[5] limit.
local period, limit

configure = function()
  period = ARGV[4]
  limit = ARGV[5]
end

-- Spent at `at`: its window is full.
spend = function(at)
  local window = idiv(at, period)
  redis.call('DEL', key)
  redis.call('HSET', key, 'w', window, 'c', limit)
  expire_at((window + 1) * period)
end

-- Takes the cost off the window it was counted in, if that is still the current one.
refund = function(cost, charged_at)
  local state = redis.call('HMGET', key, 'w', 'c')
  if state[1] and number(state[1]) == idiv(charged_at, period) then
    redis.call('HSET', key, 'c', at_least_zero(number(state[2]) - cost))
  end
end

decide = function(cost, write)
  local state = redis.call('HMGET', key, 'w', 'c')
  local window, count = 0, 0
  if state[1] then
    window = number(state[1])
    count = number(state[2])
  end
  local current = idiv(now, period)
  if current > window then
    window = current
    count = 0
  elseif current < window then
    -- The clock stepped back: now's window may have been spent before the state moved on,
    -- so it counts as spent, until its end.
    window = current
    if count < limit then
      count = limit
    end
    if write then
      put('HSET', key, 'w', window, 'c', count)
      expire_at((window + 1) * period)
    end
  end
  local reset_at = (window + 1) * period
  local remaining = at_least_zero(limit - count)
  if cost > limit then
    return {2, limit, remaining, at_least_zero(reset_at - now), 0}
  end
  if cost <= remaining then
    if write and cost > 0 then
      put('HSET', key, 'w', window, 'c', count + cost)
      expire_at(reset_at)
    end
    return {1, limit, remaining - cost, at_least_zero(reset_at - now), 0}
  end
  return {0, limit, remaining, at_least_zero(reset_at - now), at_least_zero(reset_at - now)}
end
