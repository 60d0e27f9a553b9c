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

-- A state's TTL in milliseconds: fresh (or its part's split over) `fresh_in` µs from now,
-- rounded up; at least `keep` ms, and never 0. A test passing its own time moves it faster
-- than real time, so real TTLs would expire its state early: its keys get a day.
local function ttl_of(fresh_in, keep, test_time)
  if test_time then
    return 86400000
  end
  local ttl = idiv(fresh_in + 999, 1000)
  if ttl < keep then
    ttl = keep
  end
  if ttl < 1 then
    ttl = 1
  end
  return ttl
end

-- The number a stored state's field holds: a whole number from 0 to 2^53 - 1 in decimal
-- digits, else nil. Not 'inf', 'nan', a sign, a fraction or an exponent, nor hexadecimal or
-- blanks around the digits, which `tonumber` would read as numbers: no gateway writes them.
-- A number (which a script put in place of a field it read) is its own: `n == stored` only
-- then, strings never equal numbers.
local function stored_number(stored)
  local n = tonumber(stored)
  if n == nil or n >= 9007199254740992 or (n ~= stored and not string.find(stored, '^%d+$')) then
    return nil
  end
  return n
end
