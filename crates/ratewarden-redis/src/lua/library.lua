-- The library (Redis functions, 7.0 and later): loaded once per server, after which a check
-- calls its function by name (`FCALL`) and nothing above is made again per call, as `EVAL`
-- does. `prefix`, set before, names this version of the library and its functions: versions
-- of the crate that run side by side each call their own.
-- A function of the library: `decide`'s reply, sent by `send` (reply.lua).
local function entry(decide, send)
  return function(keys, args)
    server_time = nil
    held = nil
    return send(decide(keys, args))
  end
end
-- One by one: a library's code may not use `pairs` while Redis 7.0 loads it.
redis.register_function(prefix .. 'g', entry(lone(run.g), alone))
redis.register_function(prefix .. 't', entry(lone(run.t), alone))
redis.register_function(prefix .. 'f', entry(lone(run.f), alone))
redis.register_function(prefix .. 'w', entry(lone(run.w), alone))
redis.register_function(prefix .. 'l', entry(lone(run.l), alone))
redis.register_function(prefix .. 'batch', entry(batch, packed))
redis.register_function(prefix .. 'all', entry(all, packed))
redis.register_function(prefix .. 'refund', entry(refund_all, function(r) return r end))
redis.register_function(prefix .. 'reserve', entry(reserve, packed))
redis.register_function(prefix .. 'settle', entry(settle, function(r) return r end))
redis.register_function(prefix .. 'give', entry(give_back, function(r) return r end))
redis.register_function(prefix .. 'renew', entry(renew, function(r) return r end))
