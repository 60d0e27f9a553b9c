-- A batch: `batch(KEYS, ARGV)` decides checks in order, each by its algorithm (`run[letter]`)
-- on its own keys and arguments as `prelude.lua` describes them. Checks that wait while a call
-- to Redis is in flight go together in the next call, so that the call's dispatch is paid once
-- per batch.
--
-- KEYS     every check's keys, check after check
-- ARGV[1]  the number of shapes: what checks share, all their arguments but the cost
-- then      each shape: its algorithm ('g' GCRA, 't' token bucket, 'f' fixed window, 'w'
--           sliding window, 'l' sliding log), its number of keys, its number of arguments,
--           then its arguments (the cost's place, ARGV[2] of a check, left empty)
-- then      each check: its shape (from 1) and its cost
-- Returns the checks' replies one after the other, in order, 5 numbers each (see reply.lua),
-- for `packed` to send.

-- The common check, GCRA counting on a key's own counter (no split marker, no part), is decided
-- here on states read once per batch and written once at its end: a hot key's many checks in
-- one batch cost one GET and one SET. It is `decide` of gcra.lua for that case, line for line;
-- whatever else (a state that cannot be read, a clock that stepped back, a cost above the
-- burst) goes to the algorithm's own code, after the key's state is written back.

-- Key name -> {TAT, TTL in ms when written since it was read, else nil}; a new table per call.
local states

local function write_back(name)
  local state = states[name]
  if state then
    if state[2] then
      redis.call('SET', name, state[1], 'PX', state[2])
    end
    states[name] = nil
  end
end

-- What a shape's GCRA check needs, read once per batch; nil when its checks go to the
-- algorithm's own code (another mode, a part, a split marker).
local function gcra_shape(args)
  if args[1] ~= 'c' or args[6] ~= '' or args[8] ~= '0' then
    return nil
  end
  local test_time = args[3] ~= ''
  local now
  if test_time then
    now = tonumber(args[3])
  else
    now = server_now()
  end
  return {
    now = now,
    test_time = test_time,
    interval = tonumber(args[4]),
    limit = tonumber(args[5]),
    keep = idiv((tonumber(args[7]) or 0) + 999, 1000),
  }
end

-- The check's reply, or nil when the algorithm's own code must decide.
local function gcra_check(name, shape, cost)
  local state = states[name]
  if not state then
    local stored = redis.pcall('GET', name)
    local tat = 0
    if type(stored) == 'table' then
      return nil
    elseif stored then
      tat = tonumber(stored)
      if tat == nil or tat ~= tat or tat < 0 or tat >= 9007199254740992 or tat ~= math.floor(tat) then
        return nil
      end
    end
    state = {tat, nil}
    states[name] = state
  end
  local now, interval, limit = shape.now, shape.interval, shape.limit
  local tat = state[1]
  local horizon = now + interval * limit
  if tat > horizon or cost > limit then
    return nil
  end
  if tat < now then
    tat = now
  end
  local new_tat = tat + interval * cost
  if new_tat <= horizon then
    if cost > 0 then
      local ttl = 86400000
      if not shape.test_time then
        ttl = idiv(new_tat - now + 999, 1000)
        if ttl < shape.keep then
          ttl = shape.keep
        end
        if ttl < 1 then
          ttl = 1
        end
      end
      state[1] = new_tat
      state[2] = ttl
    end
    return 1, idiv(horizon - new_tat, interval), new_tat - now, 0, cost
  end
  return 0, idiv(horizon - tat, interval), tat - now, new_tat - horizon, 0
end

local function batch(KEYS, ARGV)
  states = {}
  local shapes = {}
  local a = 2
  for i = 1, tonumber(ARGV[1]) do
    local algorithm = ARGV[a]
    local nkeys = tonumber(ARGV[a + 1])
    local nargs = tonumber(ARGV[a + 2])
    if not run[algorithm] or not nkeys or not nargs then
      error('rl: malformed batch')
    end
    local args = {unpack(ARGV, a + 3, a + 2 + nargs)}
    local shape = {run = run[algorithm], nkeys = nkeys, args = args}
    if algorithm == 'g' and nkeys == 1 then
      shape.gcra = gcra_shape(args)
    end
    shapes[i] = shape
    a = a + 3 + nargs
  end

  local replies = {}
  local n = 0
  local k = 1
  for c = a, #ARGV, 2 do
    local shape = shapes[tonumber(ARGV[c])]
    local cost = tonumber(ARGV[c + 1])
    if not shape or not cost then
      error('rl: malformed batch')
    end
    local outcome, remaining, reset_after, retry_after, granted
    if shape.gcra then
      outcome, remaining, reset_after, retry_after, granted = gcra_check(KEYS[k], shape.gcra, cost)
    end
    if outcome then
      replies[n + 1] = outcome
      replies[n + 2] = remaining
      replies[n + 3] = reset_after
      replies[n + 4] = retry_after
      replies[n + 5] = granted * 4
    else
      write_back(KEYS[k])
      local args = {unpack(shape.args)}
      args[2] = ARGV[c + 1]
      append_reply(replies, n, shape.run({unpack(KEYS, k, k + shape.nkeys - 1)}, args))
    end
    n = n + 5
    k = k + shape.nkeys
  end
  for name in pairs(states) do
    write_back(name)
  end
  return replies
end
