-- A check's arguments come as three: its mode letter, its missing-state letter ('e' or ''),
-- and its numbers as one string of little-endian doubles (each an integer below 2^53, or u64's
-- largest as `tonumber` reads it): the cost, the time in µs or -1 for Redis's clock, the
-- algorithm's figure and limit, the shortest TTL, the split's slack, then the mode's own (see
-- prelude.lua). `arguments` makes of them the ARGV that prelude.lua and the algorithms read,
-- its numbers numbers, read as they are: no `tonumber` per number (a global's lookup, a call
-- and glibc's `strtod`).

-- The `struct` format of `count` numbers, by count: 6, and up to 3 more.
local formats = {[6] = '<dddddd', [7] = '<ddddddd', [8] = '<dddddddd', [9] = '<ddddddddd'}

local function arguments(mode, missing, numbers)
  local count = #numbers / 8
  local format = formats[count]
  if not format then
    error('rl: malformed arguments')
  end
  local n = {struct.unpack(format, numbers)}
  local now = n[2]
  if now < 0 then
    now = ''
  end
  local args = {mode, n[1], now, n[3], n[4], missing, n[5], n[6]}
  for i = 7, count do
    args[i + 2] = n[i]
  end
  return args
end

-- `check` (`run[letter]`) for a check alone, whose call sends its arguments as above.
local function lone(check)
  return function(keys, args)
    return check(keys, arguments(args[1], args[2], args[3]))
  end
end
