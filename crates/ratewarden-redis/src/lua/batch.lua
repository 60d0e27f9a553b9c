-- A batch: `batch(KEYS, ARGV)` decides checks in order, each by its algorithm (`run[letter]`)
-- on its own keys and arguments as `prelude.lua` describes them. Checks that wait while a call
-- to Redis is in flight go together in the next call, so that the call's dispatch is paid once
-- per batch.
--
-- KEYS     the keys of the batch's checks, each named once
-- ARGV[1]  the number of shapes: what checks share, all their arguments but the cost
-- then     each shape: its algorithm ('g' GCRA, 't' token bucket, 'f' fixed window, 'w'
--          sliding window, 'l' sliding log), its number of keys, then its arguments as a
--          check alone sends them (args.lua), its cost 0
-- last     the checks, in order, as one string of little-endian 32-bit numbers: each check's
--          shape (from 1), its cost, and the place in KEYS of each of its shape's keys. One
--          `struct.unpack` reads them all: no string per number, no `tonumber` (`strtod`).
-- Returns the checks' replies one after the other, in order, 5 numbers each (see reply.lua),
-- for `packed` to send.

-- The common check, GCRA counting on a key's own counter (no split marker, no part), is decided
-- here on states read once per batch and written once at its end: a hot key's many checks in
-- one batch cost one GET and one SET. It decides by `gcra_step` (arith.lua), as gcra.lua does;
-- whatever else (a state that cannot be read, a clock that stepped back, a cost above the
-- burst) goes to the algorithm's own code, after the key's state is written back.

-- Key name -> {TAT, the GCRA shape of the check that last wrote it since it was read, else
-- nil}; a new table per call.
local states

-- Writes the state of `name` back, if a check wrote it, with the TTL the last such check sets
-- (`ttl_of`, as gcra.lua's `ttl_ms`: only the last write's TTL stands, so only it is worked
-- out).
local function write_back(name)
  local state = states[name]
  if state then
    local shape = state[2]
    if shape then
      redis.call('SET', name, state[1], 'PX', ttl_of(state[1] - shape.now, shape.keep, shape.test_time))
    end
    states[name] = nil
  end
end

-- What a shape's GCRA check needs, read once per batch; nil when its checks go to the
-- algorithm's own code (another mode, a part, a split marker).
local function gcra_shape(args)
  if args[1] ~= 'c' or args[6] ~= '' or args[8] ~= 0 then
    return nil
  end
  local test_time = args[3] ~= ''
  local now
  if test_time then
    now = args[3]
  else
    now = server_now()
  end
  return {
    now = now,
    test_time = test_time,
    interval = args[4],
    limit = args[5],
    keep = idiv(args[7] + 999, 1000),
  }
end

-- The state of `name` as a GCRA check reads it, kept in `states` from then on; nil when it
-- cannot be read (the algorithm's own code decides).
local function gcra_state(name)
  local stored = redis.pcall('GET', name)
  local tat = 0
  if type(stored) == 'table' then
    return nil
  elseif stored then
    tat = stored_number(stored)
    if tat == nil then
      return nil
    end
  end
  local state = {tat, nil}
  states[name] = state
  return state
end

local function malformed()
  error('rl: malformed batch')
end

local function batch(KEYS, ARGV)
  states = {}
  local shapes = {}
  local a = 2
  for i = 1, tonumber(ARGV[1]) or malformed() do
    local algorithm = ARGV[a]
    local nkeys = tonumber(ARGV[a + 1])
    -- A check's keys: its state, and maybe its split marker.
    if not run[algorithm] or (nkeys ~= 1 and nkeys ~= 2) or not ARGV[a + 4] then
      malformed()
    end
    local args = arguments(ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
    local shape = {run = run[algorithm], nkeys = nkeys, args = args}
    if algorithm == 'g' and nkeys == 1 then
      shape.gcra = gcra_shape(args)
    end
    shapes[i] = shape
    a = a + 5
  end
  local checks = ARGV[a]
  if a ~= #ARGV or #checks % 4 ~= 0 then
    malformed()
  end
  local numbers = {struct.unpack('<' .. string.rep('I4', #checks / 4), checks)}
  -- The last is where `unpack` stopped, not a number of the checks.
  local last = #numbers - 1

  local replies = {}
  local n = 0
  local c = 1
  -- The GCRA figures of the shape of the last check decided here, while checks of that shape
  -- follow one another.
  local figures, now, interval, limit
  while c <= last do
    local shape = shapes[numbers[c]]
    if not shape then
      malformed()
    end
    local nkeys = shape.nkeys
    local cost = numbers[c + 1]
    local name = KEYS[numbers[c + 2]]
    -- (A malformed batch, which no gateway sends, ends in an error here: the checks before
    -- it may have been counted, and none was admitted, as the call fails.)
    if not name or c + 1 + nkeys > last or (nkeys == 2 and not KEYS[numbers[c + 3]]) then
      malformed()
    end
    -- GCRA's step (`gcra_step`, arith.lua, as gcra.lua's `decide` takes it), unless the state
    -- cannot be read, is a clock that stepped back (past the horizon), or the cost is above
    -- the burst.
    local gcra = shape.gcra
    local state = gcra and (states[name] or gcra_state(name))
    if state then
      if gcra ~= figures then
        figures, now, interval, limit = gcra, gcra.now, gcra.interval, gcra.limit
      end
      if state[1] > now + interval * limit or cost > limit then
        state = nil
      else
        local admitted, tat, remaining, reset_after, retry_after =
          gcra_step(state[1], now, interval, limit, cost)
        replies[n + 1] = 0
        replies[n + 5] = 0
        if admitted then
          if cost > 0 then
            state[1] = tat
            state[2] = gcra
          end
          replies[n + 1] = 1
          replies[n + 5] = cost * 4
        end
        replies[n + 2] = remaining
        replies[n + 3] = reset_after
        replies[n + 4] = retry_after
      end
    end
    if not state then
      local keys = {name}
      for j = 2, nkeys do
        keys[j] = KEYS[numbers[c + 1 + j]]
      end
      for j = 1, nkeys do
        write_back(keys[j])
      end
      local args = {unpack(shape.args)}
      args[2] = cost
      append_reply(replies, n, shape.run(keys, args))
    end
    n = n + 5
    c = c + 2 + nkeys
  end
  for name in pairs(states) do
    write_back(name)
  end
  return replies
end
