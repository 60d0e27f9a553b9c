-- Sliding window counter: the state is a hash {w = window index, c = current, p = previous}.
-- ARGV[4] period (µs), ARGV[5] limit.
local period, limit

configure = function()
  period = ARGV[4]
  limit = ARGV[5]
end

local function forgotten_at(window, current, previous)
  if current > 0 then
    return (window + 2) * period
  elseif previous > 0 then
    return (window + 1) * period
  end
  return 0
end

-- The first offset into a window at which ceil(weight * (period - e) / period) <= room.
local function offset_for(weight, room)
  if weight < 1 then
    weight = 1
  end
  return at_least_zero(period - idiv(room * period, weight))
end

-- Spent at `at`: its window is full.
spend = function(at)
  local window = idiv(at, period)
  redis.call('DEL', key)
  redis.call('HSET', key, 'w', window, 'c', limit, 'p', 0)
  expire_at(forgotten_at(window, limit, 0))
end

-- Takes the cost off the window it was counted in: the current one, or the previous one.
refund = function(cost, charged_at)
  local state = redis.call('HMGET', key, 'w', 'c', 'p')
  if not state[1] then
    return
  end
  local window = number(state[1])
  local charged = idiv(charged_at, period)
  if window == charged then
    redis.call('HSET', key, 'c', at_least_zero(number(state[2]) - cost))
  elseif window == charged + 1 then
    redis.call('HSET', key, 'p', at_least_zero(number(state[3]) - cost))
  end
end

decide = function(cost, write)
  local state = redis.call('HMGET', key, 'w', 'c', 'p')
  local window, current, previous = 0, 0, 0
  if state[1] then
    window = number(state[1])
    current = number(state[2])
    previous = number(state[3])
  end
  local now_window = idiv(now, period)
  if now_window > window then
    if now_window == window + 1 then
      previous = current
    else
      previous = 0
    end
    current = 0
    window = now_window
  elseif now_window < window then
    -- The clock stepped back: everything counted so far counts fully in now's window.
    current = current + previous
    previous = 0
    window = now_window
    if write then
      put('HSET', key, 'w', window, 'c', current, 'p', previous)
      expire_at(forgotten_at(window, current, previous))
    end
  end
  local start = window * period
  local elapsed = at_least_zero(now - start)
  if elapsed > period then
    elapsed = period
  end
  local weighted = idiv(previous * (period - elapsed) + period - 1, period)
  local estimate = current + weighted
  local remaining = at_least_zero(limit - estimate)
  local reset_after = at_least_zero(forgotten_at(window, current, previous) - now)
  if cost > limit then
    return {2, limit, remaining, reset_after, 0}
  end
  if cost <= remaining then
    current = current + cost
    local fresh_at = forgotten_at(window, current, previous)
    if write and cost > 0 then
      put('HSET', key, 'w', window, 'c', current, 'p', previous)
      expire_at(fresh_at)
    end
    return {1, limit, remaining - cost, at_least_zero(fresh_at - now), 0}
  end
  local allowed_at
  if current + cost <= limit then
    allowed_at = start + offset_for(previous, limit - cost - current)
  else
    allowed_at = start + period + offset_for(current, limit - cost)
  end
  return {0, limit, remaining, reset_after, at_least_zero(allowed_at - now)}
end
