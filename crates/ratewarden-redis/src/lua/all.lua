-- Several limits of one request, decided together (`Store::check_all`): `all(KEYS, ARGV)`.
-- Each limit first decides on its state as it is, counting nothing (mode 'q'); when every
-- limit admits, each is counted ('c'); otherwise none is, and the states are left exactly as
-- they were (but a state that cannot be read, which is replaced by a spent one as a check
-- alone replaces it). Limits on the same state come merged, their costs summed: each state
-- is decided once.
--
-- KEYS  the state of each limit, each once, all in one cluster slot
-- ARGV  per limit 4: its algorithm's letter ('g', 't', 'f', 'w', 'l'), its mode ('c' counted,
--       'q' a probe, which must admit and is never counted), its missing-state letter and its
--       numbers, as a check alone sends them (args.lua)
-- Returns each limit's reply (reply.lua), then the time the limits were decided at (µs),
-- which a refund of their charges names (`refund_all`).

local function each_limit(KEYS, ARGV)
  local n = #KEYS
  if n == 0 or #ARGV ~= 4 * n then
    error('rl: malformed limits')
  end
  local limits = {}
  for i = 1, n do
    local check = run[ARGV[4 * i - 3]]
    if not check then
      error('rl: malformed limits')
    end
    limits[i] = {check, arguments(ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i])}
  end
  return limits
end

local function all(KEYS, ARGV)
  local limits = each_limit(KEYS, ARGV)
  local replies = {}
  local admitted = true
  for i, limit in ipairs(limits) do
    limit.counted = limit[2][1] == 'c'
    limit[2][1] = 'q'
    local r = limit[1]({KEYS[i]}, limit[2])
    append_reply(replies, 5 * (i - 1), r)
    admitted = admitted and r[1] == 1
  end
  for i, limit in ipairs(limits) do
    -- (flag 2: a state that could not be read, left alone by the first pass)
    if (admitted and limit.counted) or replies[5 * i] % 4 == 2 then
      limit[2][1] = 'c'
      append_reply(replies, 5 * (i - 1), limit[1]({KEYS[i]}, limit[2]))
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
  for i, limit in ipairs(each_limit(KEYS, ARGV)) do
    limit[1]({KEYS[i]}, limit[2])
  end
  return ''
end
