-- Shared by every script. Mirrors rl-core's algorithms line for line, in integer microseconds;
-- every number stays below 2^53, where Lua's doubles are exact.
--
-- KEYS[1]  the key holding the state
-- ARGV[1]  'c' to check (count the cost if it fits) or 'p' to peek (count nothing)
-- ARGV[2]  the cost
-- ARGV[3]  now in microseconds, or '' to read the Redis server's clock (TIME)
-- ARGV[4..] the algorithm's figures
--
-- Returns {outcome, limit, remaining, reset_after_us, retry_after_us}, outcome being 1 for
-- allowed, 0 for denied and 2 for a cost above what the quota admits at once.
local key = KEYS[1]
local now
-- A test that passes its own time moves it faster than real time, so real TTLs would expire
-- its state early: its keys get a day.
local test_time = ARGV[3] ~= ''
if not test_time then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now = tonumber(ARGV[3])
end

-- floor(a / b), exact for 0 <= a < 2^53 and 0 < b.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function at_least_zero(x)
  if x < 0 then
    return 0
  end
  return x
end

-- The key expires when its state equals a fresh one: a TTL in milliseconds relative to the
-- script's now, rounded up and never 0.
local function ttl_ms(fresh_at)
  if test_time then
    return 86400000
  end
  local ttl = idiv(at_least_zero(fresh_at - now) + 999, 1000)
  if ttl < 1 then
    ttl = 1
  end
  return ttl
end

local function expire_at(fresh_at)
  redis.call('PEXPIRE', key, ttl_ms(fresh_at))
end

local function number(value)
  local n = tonumber(value)
  if n == nil or n < 0 or n ~= math.floor(n) then
    error('rl: corrupt state at ' .. key)
  end
  return n
end

local decide

local function main()
  local cost = tonumber(ARGV[2])
  if ARGV[1] == 'p' then
    local one = decide(1, false)
    if one[1] == 1 then
      local zero = decide(0, false)
      if zero[1] == 1 then
        return zero
      end
    end
    return one
  end
  return decide(cost, true)
end
