-- Reservations (`Store::reserve`, `settle`, `refund`): each reserved limit's ledger, as
-- ratewarden-core's `Ledger` keeps it (the algorithm's state, units held, debt), but with each
-- hold a field of its own that lapses at its own time, so a gateway that crashed holding
-- reservations leaves nothing held once their hold time has passed, whatever else the key
-- does meanwhile.
--
-- KEYS  per limit: a held limit's state (its name with `:r`, apart from the state checks
--       count) and its holds (`:h`, a hash: hold id -> "units:lapse_at_us:hold_us", `d` ->
--       the debt, `a` -> when it was last repaid, µs); a probe's state (its key's own, read
--       only)
-- ARGV  ARGV[1] the hold time in µs (reserve, renew) or the actual units (settle) or the units
--       given back (refund); then per limit 7: its algorithm's letter, its number of keys (2 held,
--       1 a probe), its mode ('c' or 'q'), its missing-state letter, its numbers (args.lua:
--       the cost is the estimate), its emission interval in µs, its hold's id
-- A reservation replies as `all` does (each limit's reply, then the time); settle and refund
-- reply ''.

-- The most live holds on one key: a reservation beyond them is denied, so a key's hash
-- stays small enough to read whole at each reservation.
local MAX_HOLDS = 1000
-- The longest a hash is kept (ms, about 35 years) and the longest retry told (µs): a debt
-- of centuries stays within what `PEXPIRE` and a reply's numbers (below 2^53) hold.
local MAX_KEEP_MS = 2 ^ 40
local MAX_RETRY_US = 2 ^ 52

local function ledger_limits(KEYS, ARGV)
  local n = (#ARGV - 1) / 7
  if n < 1 or n ~= math.floor(n) then
    error('rl: malformed limits')
  end
  local limits = {}
  local k = 1
  for i = 1, n do
    local a = 1 + 7 * (i - 1)
    local check = run[ARGV[a + 1]]
    local nkeys = tonumber(ARGV[a + 2])
    if not check or (nkeys ~= 1 and nkeys ~= 2) or not KEYS[k + nkeys - 1] then
      error('rl: malformed limits')
    end
    local args = arguments(ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
    local holds
    if nkeys == 2 then
      holds = KEYS[k + 1]
    end
    limits[i] = {
      check = check,
      keys = {KEYS[k]},
      holds = holds,
      args = args,
      cost = args[2],
      interval = tonumber(ARGV[a + 6]) or error('rl: malformed limits'),
      id = ARGV[a + 7],
    }
    k = k + nkeys
  end
  if k ~= #KEYS + 1 then
    error('rl: malformed limits')
  end
  return limits
end

-- The limit's check in `mode` of `cost` (prelude.lua's reply).
local function decide_as(limit, mode, cost)
  local args = limit.args
  args[1] = mode
  args[2] = cost
  return limit.check(limit.keys, args)
end

-- A probe of `cost`; a state that cannot be read is replaced by a spent one first (as a
-- check replaces it), so that it never denies for good.
local function probe(limit, cost)
  local r = decide_as(limit, 'q', cost)
  if r[6] == 2 then
    decide_as(limit, 'c', 0)
    r = decide_as(limit, 'q', cost)
  end
  return r
end

local function now_of(limit)
  local at = limit.args[3]
  if at == '' then
    return server_now()
  end
  return at
end

-- The debt and when it was last repaid, read from the hash's fields: a field that cannot be
-- read (garbage, a number out of range) counts as a burst owed, never as nothing.
local function debt_of(limit, d, a)
  local debt, since = 0, 0
  if d then
    debt = stored_number(d) or limit.args[5]
  end
  if a then
    since = stored_number(a) or 0
  end
  return debt, since
end

-- The holds' hash, read whole; one that cannot be read (a key of another type) is replaced
-- by a burst owed: the key is denied until it would have refilled, never let through.
local function hash_fields(limit)
  local fields = redis.pcall('HGETALL', limit.holds)
  if fields.err then
    redis.call('DEL', limit.holds)
    return {'d', limit.args[5]}
  end
  return fields
end

-- The units of the live holds, how many there are, the debt and when it was last repaid;
-- lapsed holds are dropped. A hold whose lapse is further than its own hold time from now
-- (the server's clock stepped back) lapses a hold time from now.
local function read_ledger(limit, now)
  local fields = hash_fields(limit)
  local held, count, d, a = 0, 0, nil, nil
  for i = 1, #fields, 2 do
    local name, value = fields[i], fields[i + 1]
    if name == 'd' then
      d = value
    elseif name == 'a' then
      a = value
    else
      local units, lapse, hold = string.match(value, '^(%d+):(%d+):(%d+)$')
      units, lapse, hold = tonumber(units), tonumber(lapse), tonumber(hold)
      if units and lapse > now + hold then
        lapse = now + hold
        redis.call('HSET', limit.holds, name, string.format('%.0f:%.0f:%.0f', units, lapse, hold))
      end
      if not units or lapse <= now then
        redis.call('HDEL', limit.holds, name)
      else
        held = held + units
        count = count + 1
      end
    end
  end
  local debt, since = debt_of(limit, d, a)
  return held, count, debt, since
end

-- The debt and when it was last repaid.
local function read_debt(limit)
  local fields = redis.pcall('HMGET', limit.holds, 'd', 'a')
  if fields.err then
    redis.call('DEL', limit.holds)
    return limit.args[5], 0
  end
  local d, a = fields[1], fields[2]
  if not d then
    d = nil
  end
  if not a then
    a = nil
  end
  return debt_of(limit, d, a)
end

-- Repays `debt` (last repaid at `since`): into the state as far as it has room, and at
-- least at the quota's rate since (the state was full: its refill went to the debt); as
-- ratewarden-core's `Ledger` repays. Returns what is still owed and when it was repaid.
local function repay(limit, debt, since, now)
  if debt <= 0 then
    return 0, 0
  end
  local room = probe(limit, 0)[3]
  local pay = math.min(debt, room, limit.args[5])
  local repaid = 0
  if pay > 0 and decide_as(limit, 'c', pay)[1] == 1 then
    repaid = pay
  end
  if since > 0 and since <= now then
    repaid = math.max(repaid, idiv(now - since, math.max(limit.interval, 1)))
  end
  debt = at_least_zero(debt - repaid)
  if debt > 0 then
    return debt, math.max(now, 1)
  end
  return 0, 0
end

-- Writes the debt, and keeps the holds' hash at least until `until_us` (µs from now) and,
-- while debt is owed, until it could have been repaid.
local function keep(limit, debt, since, until_us)
  if debt > 0 then
    redis.call('HSET', limit.holds, 'd', string.format('%.0f', debt), 'a',
      string.format('%.0f', since))
    until_us = math.max(until_us, (debt + limit.args[5]) * limit.interval + limit.args[7])
  else
    redis.call('HDEL', limit.holds, 'd', 'a')
  end
  if redis.call('EXISTS', limit.holds) == 1 then
    local ms = math.min(idiv(until_us + 999, 1000) + 1000, MAX_KEEP_MS)
    if redis.call('PTTL', limit.holds) < ms then
      redis.call('PEXPIRE', limit.holds, string.format('%.0f', ms))
    end
  end
end

local function reserve(KEYS, ARGV)
  local hold_us = tonumber(ARGV[1]) or error('rl: malformed limits')
  local limits = ledger_limits(KEYS, ARGV)
  local replies = {}
  local admitted = true
  -- Units this call holds already on each hash (two limits on one state).
  local pending = {}
  for i, limit in ipairs(limits) do
    local r
    limit.now = now_of(limit)
    if limit.holds then
      local held, count, debt, since = read_ledger(limit, limit.now)
      debt, since = repay(limit, debt, since, limit.now)
      keep(limit, debt, since, 0)
      local burst = limit.args[5]
      local wanted = held + debt + (pending[limit.holds] or 0) + limit.cost
      if limit.cost > burst then
        r = probe(limit, limit.cost)
      elseif wanted > burst or count >= MAX_HOLDS then
        -- Room for the units, not beside what is held and owed: when all of it would fit,
        -- the holds settled at their estimates (ratewarden-core's `Ledger::reserve`).
        local room = probe(limit, 0)[3]
        r = probe(limit, math.min(limit.cost, burst))
        r[1] = 0
        r[3] = 0
        r[5] = math.min(math.max(r[5], math.max(wanted - room, 1) * limit.interval), MAX_RETRY_US)
      else
        r = probe(limit, wanted)
      end
      pending[limit.holds] = (pending[limit.holds] or 0) + limit.cost
    else
      r = probe(limit, limit.cost)
    end
    append_reply(replies, 5 * (i - 1), r)
    admitted = admitted and r[1] == 1
  end
  if admitted then
    for _, limit in ipairs(limits) do
      if limit.holds then
        redis.call('HSET', limit.holds, limit.id,
          string.format('%.0f:%.0f:%.0f', limit.cost, limit.now + hold_us, hold_us))
        local debt, since = read_debt(limit)
        keep(limit, debt, since, hold_us)
      end
    end
  end
  replies[5 * #limits + 1] = limits[1].now
  return replies
end

-- Ends holds: drops each (lapsed or not) and charges the actual units, as debt first.
local function settle(KEYS, ARGV)
  local actual = tonumber(ARGV[1]) or error('rl: malformed limits')
  for _, limit in ipairs(ledger_limits(KEYS, ARGV)) do
    if limit.holds then
      local debt, since = read_debt(limit)
      redis.call('HDEL', limit.holds, limit.id)
      local now = now_of(limit)
      if debt == 0 then
        since = 0
      end
      debt, since = repay(limit, debt + actual, since, now)
      keep(limit, debt, since, 0)
    end
  end
  return ''
end

-- Gives back units: debt first, then the state as a charge made now would be given back.
local function give_back(KEYS, ARGV)
  local units = tonumber(ARGV[1]) or error('rl: malformed limits')
  for _, limit in ipairs(ledger_limits(KEYS, ARGV)) do
    if limit.holds then
      local debt, since = read_debt(limit)
      local from_debt = math.min(debt, units)
      keep(limit, debt - from_debt, since, 0)
      if units > from_debt then
        local now = now_of(limit)
        limit.args[9] = now
        decide_as(limit, 'r', units - from_debt)
      end
    end
  end
  return ''
end

-- Keeps live holds for the hold time more from now (a request that runs longer than its
-- hold renews it); a hold that lapsed or was settled stays so.
local function renew(KEYS, ARGV)
  local hold_us = tonumber(ARGV[1]) or error('rl: malformed limits')
  for _, limit in ipairs(ledger_limits(KEYS, ARGV)) do
    if limit.holds and redis.call('TYPE', limit.holds).ok == 'hash' then
      local value = redis.call('HGET', limit.holds, limit.id)
      local units, lapse = string.match(value or '', '^(%d+):(%d+):%d+$')
      local now = now_of(limit)
      if units and tonumber(lapse) > now then
        redis.call('HSET', limit.holds, limit.id,
          string.format('%.0f:%.0f:%.0f', tonumber(units), now + hold_us, hold_us))
        local debt, since = read_debt(limit)
        keep(limit, debt, since, hold_us)
      end
    end
  end
  return ''
end
