-- Sliding window log: the state is a list of admission times (µs), oldest first, one per unit
-- of cost, never longer than the limit. ARGV[4] period (µs), ARGV[5] limit.
local period, limit

configure = function()
  period = ARGV[4]
  limit = ARGV[5]
end

-- Spent at `at`: the log is full of `at`.
spend = function(at)
  local times = {}
  for i = 1, limit do
    times[i] = at
  end
  redis.call('DEL', key)
  redis.call('RPUSH', key, unpack(times))
  expire_at(at + period)
end

-- Removes `cost` of the entries stamped with the charge's time.
refund = function(cost, charged_at)
  if cost > 0 then
    redis.call('LREM', key, -cost, charged_at)
  end
end

decide = function(cost, write)
  local entries = redis.call('LRANGE', key, 0, -1)
  -- No log is longer than its limit (nor could one of more than 8,000 be written back).
  if #entries > limit then
    error('rl: corrupt state')
  end
  -- Stamps are the time rounded up to the microsecond (ratewarden-core stamps nanoseconds so): equal
  -- to now here, where the clock has microseconds only.
  local stamp = now
  -- The clock stepped back: what was stamped later counts as stamped now.
  local clamped = false
  for i = #entries, 1, -1 do
    if number(entries[i]) <= stamp then
      break
    end
    entries[i] = stamp
    clamped = true
  end
  local first = 1
  while entries[first] and number(entries[first]) + period <= now do
    first = first + 1
  end
  local len = #entries - first + 1
  if write and clamped then
    put('DEL', key)
    if len > 0 then
      put('RPUSH', key, unpack(entries, first, #entries))
      expire_at(number(entries[#entries]) + period)
    end
  elseif write and first > 1 then
    if len == 0 then
      put('DEL', key)
    else
      put('LTRIM', key, first - 1, -1)
    end
  end
  local last = nil
  if len > 0 then
    last = number(entries[#entries])
  end
  local expires_after = 0
  if last then
    expires_after = at_least_zero(last + period - now)
  end
  local remaining = at_least_zero(limit - len)
  if cost > limit then
    return {2, limit, remaining, expires_after, 0}
  end
  if cost <= remaining then
    local at = stamp
    if write and cost > 0 then
      local times = {}
      for i = 1, cost do
        times[i] = at
      end
      put('RPUSH', key, unpack(times))
      expire_at(at + period)
    end
    local expires = expires_after
    if cost > 0 then
      expires = at_least_zero(at + period - now)
    end
    return {1, limit, remaining - cost, expires, 0}
  end
  local entry = number(entries[first + len + cost - limit - 1])
  return {0, limit, remaining, expires_after, at_least_zero(entry + period - now)}
end
