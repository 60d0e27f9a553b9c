-- The library (Redis functions, 7.0 and later): loaded once per server, after which a check
-- calls its function by name (`FCALL`) and nothing above is made again per call, as `EVAL`
-- does. `prefix`, set before, names this version of the library and its functions: versions
-- of the crate that run side by side each call their own.
local function entry(decide)
  return function(keys, args)
    server_time = nil
    return decide(keys, args)
  end
end
-- One by one: a library's code may not use `pairs` while Redis 7.0 loads it.
redis.register_function(prefix .. 'g', entry(run.g))
redis.register_function(prefix .. 't', entry(run.t))
redis.register_function(prefix .. 'f', entry(run.f))
redis.register_function(prefix .. 'w', entry(run.w))
redis.register_function(prefix .. 'l', entry(run.l))
redis.register_function(prefix .. 'batch', entry(batch))
