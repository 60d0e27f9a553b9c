-- One check: the functions of an algorithm's check, which the algorithm's file completes, in a
-- block of their own with `KEYS` and `ARGV` as its locals (see src/script/mod.rs); `main` decides
-- the check they hold. Mirrors ratewarden-core's algorithms line for line, in
-- integer microseconds; every number stays below 2^53, where Lua's doubles are exact.
--
-- ARGV is made by `arguments` (args.lua) from the three arguments a call sends: its numbers
-- are numbers, ARGV[3] is '' for Redis's clock, ARGV[1] and ARGV[6] are letters.
--
-- KEYS[1]  the key holding the state
-- KEYS[2]  (adaptive hot keys only) the key's split marker, a hash {n = parts, e = epoch,
--          u = until}: while it stands the key is split, and checks of the key itself are
--          answered "split" (or, past `u`, denied until the marker expires)
-- ARGV[1]  'c' check (count the cost if it fits), 'p' peek (count nothing), 'l' lease (count
--          as much as there is up to ARGV[9], at least the cost), 'h' split the key (promote or
--          renew: ARGV[9] parts, ARGV[10] hold in µs, ARGV[11] margin in µs), 'i' start a part
--          of a new split, if it has no state yet, with ARGV[9] units left at ARGV[10] (µs),
--          'q' decide the cost without counting it (one limit of several, `all.lua`), 'r'
--          give back the cost a check counted at ARGV[9] (µs; `refund`, mirroring
--          ratewarden-core's `AlgorithmState::refund`)
-- ARGV[2]  the cost
-- ARGV[3]  now in microseconds, or '' for the Redis server's clock (TIME, read once per batch)
-- ARGV[4]  the algorithm's figure (interval or period, µs), ARGV[5] its limit
-- ARGV[6]  'e' when a missing state means "not seeded yet" rather than "fresh" (a part of an
--          adaptive split: the key's remaining burst is not handed out again); else ''
-- ARGV[7]  the shortest TTL in µs for a written state (a part lives as long as its split), or ''
-- ARGV[8]  with a marker, the longest a split can still run (its hold and margin, µs), else 0:
--          a key is spent until its split ends, so a state ahead of now by no more than this
--          is not a clock that stepped back, and is kept
--
-- Returns {outcome, limit, remaining, reset_after_us, retry_after_us, flag, granted}:
-- outcome 1 allowed, 0 denied, 2 a cost above what the quota admits at once, 3 split (then
-- {3, parts, split_for_us, epoch, 0, 0, 0}), 4 split by this call (then {4, parts,
-- split_for_us, epoch, units left to the parts, 0, 0}: the caller seeds them); flag 1
-- when the state was corrupt and was replaced by a spent one, 2 when it was corrupt and left
-- alone (a peek), 3 for a part its seed has not reached (`unseeded`); granted the units
-- counted.
-- The check's own values, set by `begin` at each call: the functions below are made once (when
-- Redis loads the library, or once per `EVAL`), not at every check.
local key, marker, now, test_time, absent_spent, keep_ms, split_slack
-- Set by each algorithm: configure(), which reads its figures from ARGV.
local configure

local function begin()
  key = KEYS[1]
  marker = KEYS[2]
  -- A test that passes its own time moves it faster than real time, so real TTLs would
  -- expire its state early: its keys get a day.
  test_time = ARGV[3] ~= ''
  if not test_time then
    now = server_now()
  else
    now = ARGV[3]
  end
  absent_spent = ARGV[6] == 'e'
  keep_ms = idiv(ARGV[7] + 999, 1000)
  split_slack = ARGV[8]
  configure()
end

-- The key expires when its state equals a fresh one (or, for a part, once its split is over):
-- a TTL in milliseconds relative to the script's now, rounded up and never 0.
local function ttl_ms(fresh_at)
  return ttl_of(at_least_zero(fresh_at - now), keep_ms, test_time)
end

local function expire_at(fresh_at)
  put('PEXPIRE', key, ttl_ms(fresh_at))
end

-- A stored number (`stored_number`), or the error of a corrupt state.
local function number(value)
  return stored_number(value) or error('rl: corrupt state')
end

-- The decision on a part of an adaptive split that its seed has not reached yet: denied,
-- nothing written (so that the seed, which writes only a part that has no state, still
-- lands), and to be retried at once rather than after a refill (the seed is a round trip
-- behind the split); flag 3 says so.
local function unseeded()
  return {0, ARGV[5], 0, 0, 0, 3}
end

-- Set by each algorithm: decide(cost, write), spend(at), which writes a state spent at `at`
-- (fully used, refilling from then on; never less spent than it is), and refund(cost,
-- charged_at). GCRA and the token bucket also set seed(at, units), which writes a state with
-- `units` left at `at`.
local decide
local spend
local seed
local refund

-- A decision as the script replies it: with its flag, and the units it counted.
local function reply(r, flag, cost)
  r[6] = flag
  r[7] = 0
  if r[1] == 1 then
    r[7] = cost
  end
  return r
end

-- The decision on a key whose state cannot be read: denied; when writing, the state is
-- replaced by one spent at `spent_at` that refills from then (flag 1), else (or while writes
-- are held, `put`) left alone (flag 2).
local function replaced(cost, write, spent_at)
  if not write or held then
    return {0, ARGV[5], 0, 0, 0, 2, 0}
  end
  redis.call('DEL', key)
  spend(spent_at)
  return reply(decide(cost, true), 1, cost)
end

-- Decides; a state that cannot be read (garbage, or a key of another type) counts as spent
-- now: the key is denied, never let through, and (when writing) its state is replaced.
local function guarded(cost, write)
  local ok, result = pcall(decide, cost, write)
  if ok then
    return reply(result, result[6] or 0, cost)
  end
  local err = result
  if type(result) == 'table' then
    err = result.err
  end
  err = tostring(err)
  if not (string.find(err, 'rl: corrupt state', 1, true) or string.find(err, 'WRONGTYPE', 1, true)) then
    -- Any other error (OOM, READONLY, ...) goes back as Redis raised it, its code first.
    error(redis.error_reply(err))
  end
  return replaced(cost, write, now)
end

-- The split marker: nil when absent, its four numbers {n, e, u, m} when whole, false when it
-- cannot be read (a key of another type, a field missing or garbled).
local function read_marker()
  local m = redis.pcall('HMGET', marker, 'n', 'e', 'u', 'm')
  if type(m) ~= 'table' or m.err then
    return false
  end
  if not (m[1] or m[2] or m[3] or m[4]) then
    return nil
  end
  local ok, fields = pcall(function()
    return {number(m[1]), number(m[2]), number(m[3]), number(m[4])}
  end)
  -- 2 to 64 parts, and a split that ends within the longest any can run from now.
  if not ok or fields[1] < 2 or fields[1] > 64 or fields[3] > now + split_slack then
    return false
  end
  return fields
end

-- A split's reply: outcome 4 when this call made it (the caller seeds its parts with `left`),
-- 3 when it stood already.
local function split_reply(parts, until_us, epoch, left, made)
  local outcome = 3
  if made then
    outcome = 4
  end
  return {outcome, parts, at_least_zero(until_us - now), epoch, left, 0, 0}
end

local function main()
  begin()
  local mode = ARGV[1]
  local cost = ARGV[2]
  if mode == 'i' then
    if redis.call('EXISTS', key) == 0 then
      seed(ARGV[10], ARGV[9])
    end
    return {1, 0, 0, 0, 0, 0, 0}
  end
  if mode == 'r' then
    -- A state that cannot be read is left as it is: it denies until replaced.
    pcall(refund, cost, ARGV[9])
    return {1, ARGV[5], 0, 0, 0, 0, 0}
  end
  if marker then
    local m = read_marker()
    if m and now >= m[3] + m[4] then
      -- Outlived its split and margin (it has no TTL): forgotten.
      if mode ~= 'p' then
        put('DEL', marker)
      end
      m = nil
    end
    if m == false then
      -- A marker that cannot be read: whether the key was split, and what its parts hold, is
      -- unknown, so the key counts as spent for as long as a split could still run (and a
      -- new split gets nothing of it), and the marker goes.
      if mode ~= 'h' then
        if mode ~= 'p' then
          put('DEL', marker)
        end
        return replaced(cost, mode ~= 'p', now + split_slack)
      end
      redis.call('DEL', marker)
      redis.call('DEL', key)
      spend(now + split_slack)
      m = nil
    end
    local standing = m ~= nil
    if mode == 'h' then
      local parts = ARGV[9]
      local hold = ARGV[10]
      local margin = ARGV[11]
      local epoch = now
      local left = 0
      local made = not (standing and m[3] > now)
      if not made then
        -- Renewed: the same split goes on.
        parts = m[1]
        epoch = m[2]
      elseif not standing then
        -- A new split: what the key has left now goes to its parts (which the caller seeds).
        local available = guarded(0, false)
        if available[6] == 0 then
          left = available[3]
        end
      end
      local until_us = now + hold
      -- The key itself admits nothing until its split is over and a margin has passed (a
      -- part's check sent before the end may still run), and is spent then.
      spend(until_us + margin)
      redis.call('HSET', marker, 'n', parts, 'e', epoch, 'u', until_us, 'm', margin)
      redis.call('PEXPIRE', marker, idiv(until_us + margin - now + 999, 1000))
      return split_reply(parts, until_us, epoch, left, made)
    end
    if standing then
      local until_us = m[3]
      if now < until_us then
        return split_reply(m[1], until_us, m[2], 0, false)
      end
      -- Over, within its margin: denied until the marker is gone.
      local free_at = until_us + m[4] + cost * ARGV[4]
      return {0, ARGV[5], 0, at_least_zero(free_at - now), at_least_zero(free_at - now), 0, 0}
    end
  end
  if mode == 'q' then
    return guarded(cost, false)
  end
  if mode == 'p' then
    local one = guarded(1, false)
    if one[1] == 1 then
      local zero = guarded(0, false)
      if zero[1] == 1 then
        return zero
      end
    end
    return one
  end
  if mode == 'l' then
    -- As much as there is, up to the batch: one round trip whatever is left.
    local available = guarded(0, false)
    local grant = ARGV[9]
    if available[6] == 0 and available[3] < grant then
      grant = available[3]
    end
    if grant > cost then
      return guarded(grant, true)
    end
  end
  return guarded(cost, true)
end
