-- The one script: it decides a batch of checks, in order, each by its algorithm on its own keys
-- and arguments as `prelude.lua` describes them. Checks that wait while a call to Redis is in
-- flight go together in the next call, so that the script's dispatch is paid once per batch.
--
-- KEYS     every check's keys, check after check
-- ARGV[1]  the number of shapes: what checks share, all their arguments but the cost
-- then      each shape: its algorithm ('g' GCRA, 't' token bucket, 'f' fixed window, 'w'
--           sliding window, 'l' sliding log), its number of keys, its number of arguments,
--           then its arguments (the cost's place, ARGV[2] of a check, left empty)
-- then      each check: its shape (from 1) and its cost
-- Returns the checks' replies one after the other, in order, 5 numbers each: a decision as
-- {outcome, remaining, reset_after_us, retry_after_us, granted * 4 + flag} (the limit, which
-- the caller knows, left out), a split as {3, parts, split_for_us, epoch, units left}; see
-- prelude.lua for what each means.

-- Redis's clock, read once per call: the checks of one batch are decided at one instant.
local server_time
local function server_now()
  if not server_time then
    local time = redis.call('TIME')
    server_time = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  return server_time
end

