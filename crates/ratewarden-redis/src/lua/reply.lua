-- What every call replies: one string, 5 numbers per check, each a little-endian double (exact:
-- every number stays below 2^53), so that a gateway reads a call's reply as one value, not as
-- 5 per check. A decision is {outcome, remaining, reset_after_us, retry_after_us,
-- granted * 4 + flag} (the limit, which the caller knows, left out), a split {3 or 4, parts,
-- split_for_us, epoch, units left}; see prelude.lua for what each means.

-- Appends `r`, a check's reply as prelude.lua's `main` returns it, to `replies` after its
-- `n` numbers.
local function append_reply(replies, n, r)
  replies[n + 1] = r[1]
  if r[1] >= 3 then
    replies[n + 2] = r[2]
    replies[n + 3] = r[3]
    replies[n + 4] = r[4]
    replies[n + 5] = r[5]
  else
    replies[n + 2] = r[3]
    replies[n + 3] = r[4]
    replies[n + 4] = r[5]
    replies[n + 5] = r[7] * 4 + r[6]
  end
end

local function packed(replies)
  return struct.pack('<' .. string.rep('d', #replies), unpack(replies))
end

-- The reply of a check alone, as `append_reply` and `packed` would make it.
local function alone(r)
  if r[1] >= 3 then
    return struct.pack('<ddddd', r[1], r[2], r[3], r[4], r[5])
  end
  return struct.pack('<ddddd', r[1], r[3], r[4], r[5], r[7] * 4 + r[6])
end
