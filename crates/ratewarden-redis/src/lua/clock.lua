-- Redis's clock, read once per call (each call's entry sets `server_time` to nil): the checks of
-- one batch are decided at one instant.
local server_time
local function server_now()
  if not server_time then
    local time = redis.call('TIME')
    server_time = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  return server_time
end

