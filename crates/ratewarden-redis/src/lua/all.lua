-- Several limits of one request, decided together (`Store::check_all`): `all(KEYS, ARGV)`.
-- Each limit first decides on its state as it is, counting nothing (mode 'q'); when every
-- limit admits, each is counted ('c'); otherwise none is, and the states are left exactly as
-- they were (but a state that cannot be read, which is replaced by a spent one as a check
-- alone replaces it). Limits on the same state come merged, their costs summed: each state
-- is decided once.
--
-- KEYS  the keys of each limit in turn: its state, and for a key that adaptive hot-key
--       splitting may have split, its split marker; all in one cluster slot
-- ARGV  per limit 5: its algorithm's letter ('g', 't', 'f', 'w', 'l'), its number of keys,
--       its mode ('c' counted, 'q' a probe, which must admit and is never counted), its
--       missing-state letter and its numbers, as a check alone sends them (args.lua)
-- A limit whose key is split answers so (outcome 3, prelude.lua), and nothing is counted:
-- the caller learns of the split and asks again, of a part.
-- Returns each limit's reply (reply.lua), then the time the limits were decided at (µs),
-- which a refund of their charges names (`refund_all`).

local function each_limit(KEYS, ARGV)
  local n = #ARGV / 5
  if n == 0 or #ARGV % 5 ~= 0 then
    error('rl: malformed limits')
  end
  local limits = {}
  local k = 1
  for i = 1, n do
    local a = 5 * (i - 1)
    local check = run[ARGV[a + 1]]
    local nkeys = tonumber(ARGV[a + 2])
    if not check or (nkeys ~= 1 and nkeys ~= 2) or not KEYS[k + nkeys - 1] then
      error('rl: malformed limits')
    end
    local keys = {KEYS[k], KEYS[k + 1]}
    if nkeys == 1 then
      keys[2] = nil
    end
    k = k + nkeys
    limits[i] = {check, arguments(ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]), keys = keys}
  end
  if k ~= #KEYS + 1 then
    error('rl: malformed limits')
  end
  return limits
end

local function all(KEYS, ARGV)
  local limits = each_limit(KEYS, ARGV)
  local replies = {}
  local admitted = true
  for i, limit in ipairs(limits) do
    limit.counted = limit[2][1] == 'c' and limit[2][2] > 0
    limit[2][1] = 'q'
    local r = limit[1](limit.keys, limit[2])
    append_reply(replies, 5 * (i - 1), r)
    admitted = admitted and r[1] == 1
  end
  for i, limit in ipairs(limits) do
    -- (flag 2: a state that could not be read, left alone by the first pass)
    if (admitted and limit.counted) or replies[5 * i] % 4 == 2 then
      limit[2][1] = 'c'
      append_reply(replies, 5 * (i - 1), limit[1](limit.keys, limit[2]))
    end
  end
  local now = limits[1][2][3]
  if now == '' then
    now = server_now()
  end
  replies[5 * #limits + 1] = now
  return replies
end

-- Gives back charges `all` counted: ARGV as for `all`, each limit in mode 'r' with the time of
-- its charge.
local function refund_all(KEYS, ARGV)
  for _, limit in ipairs(each_limit(KEYS, ARGV)) do
    limit[1](limit.keys, limit[2])
  end
  return ''
end
