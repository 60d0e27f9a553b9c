-- The least a GCRA check in Redis does: read the clock and the state, write the state with a
-- TTL. KEYS[1] the state, ARGV[1] the emission interval (µs), ARGV[2] the burst. The bare loop
-- of benches/src/bin/redis_throughput.rs and benches/scripts/redis_instructions.sh run it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new = tat + interval
if new - now <= interval * burst then
  redis.call('SET', KEYS[1], new, 'PX', math.floor((new - now) / 1000) + 1)
  return {1, new - now}
end
return {0, tat - now}
