-- Several limits of one request, decided together (`Store::check_all`): `all(KEYS, ARGV)`.
-- Each limit is decided once, as a check alone decides it, its writes held (`put`); when
-- every limit admits, the writes are made, in order; otherwise none is, and the states are
-- left exactly as they were (but a state that cannot be read, which is replaced by a spent
-- one as a check alone replaces it, and the limits decided again). Limits on the same state
-- come merged, their costs summed: each state is decided once, and no limit reads a state
-- another wrote.
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

-- The limits of `KEYS` and `ARGV`: each {its algorithm's check, its arguments (args.lua),
-- keys = its keys}; or, for the common limit, GCRA on a key's own counter (no split marker,
-- no part) when `fast`, {gcra = its numbers, name = its state's key, a = where its ARGV
-- start}, which `gcra` decides.
local function each_limit(KEYS, ARGV, fast)
  local n = #ARGV / 5
  if n == 0 or #ARGV % 5 ~= 0 then
    error('rl: malformed limits')
  end
  local limits = {}
  local k = 1
  for i = 1, n do
    local a = 5 * (i - 1)
    local letter = ARGV[a + 1]
    local check = run[letter]
    local nkeys = tonumber(ARGV[a + 2])
    if not check or (nkeys ~= 1 and nkeys ~= 2) or not KEYS[k + nkeys - 1] then
      error('rl: malformed limits')
    end
    local numbers = ARGV[a + 5]
    if fast and letter == 'g' and nkeys == 1 and ARGV[a + 4] == '' and #numbers == 48 then
      -- cost, time (or -1), interval, burst, shortest TTL, split slack (args.lua)
      limits[i] = {gcra = {struct.unpack('<dddddd', numbers)}, name = KEYS[k], a = a}
    else
      local keys = {KEYS[k], KEYS[k + 1]}
      if nkeys == 1 then
        keys[2] = nil
      end
      limits[i] = {check, arguments(ARGV[a + 3], ARGV[a + 4], numbers), keys = keys}
    end
    k = k + nkeys
  end
  if k ~= #KEYS + 1 then
    error('rl: malformed limits')
  end
  return limits
end

-- Decides a fast limit (`each_limit`) as gcra.lua decides it (by `gcra_step`, arith.lua),
-- at a fraction of the cost of the algorithm's own code: puts its reply in `replies` after
-- `n` numbers, and when it counts and admits, its state's key, TAT and TTL in `sets`. False
-- for whatever that code decides instead (a state that cannot be read, a clock that stepped
-- back, a cost above the burst), and the limit gets its arguments for it.
local function gcra(limit, counted, replies, n, sets, ARGV)
  local numbers = limit.gcra
  local cost, at, interval, burst, keep, slack =
    numbers[1], numbers[2], numbers[3], numbers[4], numbers[5], numbers[6]
  local tat = 0
  if slack == 0 then
    local stored = redis.pcall('GET', limit.name)
    if type(stored) == 'table' then
      tat = nil
    elseif stored then
      tat = stored_number(stored)
    end
  end
  local now = at
  if at < 0 then
    now = server_now()
  end
  if slack ~= 0 or tat == nil or tat > now + interval * burst or cost > burst then
    local a = limit.a
    limit[1] = run.g
    limit[2] = arguments(ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
    limit.keys = {limit.name}
    return false
  end
  local admitted, new_tat, remaining, reset_after, retry_after =
    gcra_step(tat, now, interval, burst, cost)
  replies[n + 2] = remaining
  replies[n + 3] = reset_after
  replies[n + 4] = retry_after
  if not admitted then
    replies[n + 1] = 0
    replies[n + 5] = 0
    return true
  end
  replies[n + 1] = 1
  replies[n + 5] = cost * 4
  if counted and cost > 0 then
    local s = #sets
    sets[s + 1] = limit.name
    sets[s + 2] = new_tat
    sets[s + 3] = ttl_of(new_tat - now, idiv(keep + 999, 1000), at >= 0)
  end
  return true
end

-- The time `limit` was decided at (µs).
local function decided_at(limit)
  local at
  if limit.gcra then
    at = limit.gcra[2]
  else
    at = limit[2][3]
  end
  if at == '' or at < 0 then
    return server_now()
  end
  return at
end

-- Decides each limit once, its writes held: puts their replies in `replies`, and returns
-- whether every limit admits, the writes to make if so (`put`'s, then `gcra`'s SETs), and
-- whether a state could not be read (flag 2: left alone while writes were held).
local function decide_each(limits, ARGV, replies)
  local writes, sets = {}, {}
  local admitted, unreadable = true, false
  held = writes
  for i, limit in ipairs(limits) do
    local n = 5 * (i - 1)
    local counted = ARGV[n + 3] == 'c'
    if not (limit.gcra and gcra(limit, counted, replies, n, sets, ARGV)) then
      local args = limit[2]
      args[1] = 'c'
      if not counted or args[2] == 0 then
        args[1] = 'q'
      end
      append_reply(replies, n, limit[1](limit.keys, args))
    end
    admitted = admitted and replies[n + 1] == 1
    unreadable = unreadable or replies[n + 5] % 4 == 2
  end
  held = nil
  return admitted, writes, sets, unreadable
end

local function all(KEYS, ARGV)
  local limits = each_limit(KEYS, ARGV, true)
  local replies = {}
  local admitted, writes, sets, unreadable = decide_each(limits, ARGV, replies)
  if unreadable then
    -- Each state that could not be read is replaced by a spent one (or its split marker
    -- dropped, the key spent), as a check alone replaces it; then every limit is decided
    -- again on what is there, so that a request is admitted only with every limit counted.
    local replaced = {}
    for i, limit in ipairs(limits) do
      if replies[5 * i] % 4 == 2 then
        limit[2][1] = 'c'
        limit[1](limit.keys, limit[2])
        replaced[#replaced + 1] = i
      end
    end
    admitted, writes, sets, unreadable = decide_each(limits, ARGV, replies)
    admitted = admitted and not unreadable
    for _, i in ipairs(replaced) do
      -- (flag 1: a state that could not be read, replaced)
      if replies[5 * i] % 4 == 0 then
        replies[5 * i] = replies[5 * i] + 1
      end
    end
  end
  if admitted then
    for _, w in ipairs(writes) do
      redis.call(unpack(w))
    end
    for s = 1, #sets, 3 do
      redis.call('SET', sets[s], sets[s + 1], 'PX', sets[s + 2])
    end
  end
  replies[5 * #limits + 1] = decided_at(limits[1])
  return replies
end

-- Gives back charges `all` counted: ARGV as for `all`, each limit in mode 'r' with the time of
-- its charge.
local function refund_all(KEYS, ARGV)
  for _, limit in ipairs(each_limit(KEYS, ARGV, false)) do
    limit[1](limit.keys, limit[2])
  end
  return ''
end
