-- The library (Redis functions, 7.0 and later): loaded once per server, after which a check
-- calls its function by name (`FCALL`) and nothing above is made again per call, as `EVAL`
-- does. `prefix`, set before, names this version of the library and its functions: versions
-- of the crate that run side by side each call their own.
-- A function of the library: `decide`'s reply, sent by `send` (reply.lua).
local function entry(decide, send)
  return function(keys, args)
    server_time = nil
    return send(decide(keys, args))
  end
end
-- One by one: a library's code may not use `pairs` while Redis 7.0 loads it.
redis.register_function(prefix .. 'g', entry(run.g, alone))
redis.register_function(prefix .. 't', entry(run.t, alone))
redis.register_function(prefix .. 'f', entry(run.f, alone))
redis.register_function(prefix .. 'w', entry(run.w, alone))
redis.register_function(prefix .. 'l', entry(run.l, alone))
redis.register_function(prefix .. 'batch', entry(batch, packed))
