-- Integer arithmetic on Lua's doubles, shared by every script: numbers stay below 2^53,
-- where doubles are exact.

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

-- One GCRA check of `cost` (at most the burst `limit`) on the theoretical arrival time `tat`
-- at `now`, with emission interval `interval`: whether it admits, the TAT after it (the new
-- one if admitted, else `tat` clamped to now), and the reply's remaining, reset-after and
-- retry-after (µs). The one place GCRA's arithmetic is written: a check alone (gcra.lua) and
-- a batch's fast path (batch.lua) both decide by it, as ratewarden-core does.
local function gcra_step(tat, now, interval, limit, cost)
  local horizon = now + interval * limit
  if tat < now then
    tat = now
  end
  local new_tat = tat + interval * cost
  if new_tat <= horizon then
    return true, new_tat, idiv(horizon - new_tat, interval), new_tat - now, 0
  end
  return false, tat, idiv(at_least_zero(horizon - tat), interval), tat - now, new_tat - horizon
end

-- A state's TTL in milliseconds: fresh (or its part's split over) `fresh_in` µs from now,
-- rounded up; at least `keep` ms, and never 0. A test passing its own time moves it faster
-- than real time, so real TTLs would expire its state early: its keys get a day more.
local function ttl_of(fresh_in, keep, test_time)
  local ttl = idiv(fresh_in + 999, 1000)
  if test_time then
    ttl = ttl + 86400000
  end
  if ttl < keep then
    ttl = keep
  end
  if ttl < 1 then
    ttl = 1
  end
  return ttl
end

-- The number a stored state's field holds: a whole number from 0 to 2^53 - 1, else nil.
-- Written as digits, as every Redis but 7.2.0 to 7.2.4 writes a script's whole numbers; those
-- write one with 8 or more trailing zeros as `fpconv_dtoa` does (redis/redis#13113): a digit,
-- maybe a point and more digits, `e+` and the exponent (100000000 is `1e+8`). Nothing else
-- that `tonumber` would read: no sign, fraction, hexadecimal, blanks, nor text after a NUL.
-- A number (which a script put in place of a field it read) is its own.
local function stored_number(stored)
  local n = tonumber(stored)
  if n == nil or n >= 9007199254740992 then
    return nil
  end
  if n == stored or string.find(stored, '^%d+$') then
    return n
  end
  if n == math.floor(n) and string.find(stored, '^%d%.?%d*e%+%d+$') then
    return n
  end
  return nil
end
