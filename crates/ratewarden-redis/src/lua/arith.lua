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
