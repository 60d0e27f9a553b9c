-- A check's writes (`put`): made at once, or, while `held` is a table, held in it in order, so that
-- several limits decided together (all.lua) write only once every one of them admits. Each
-- call's entry sets `held` to nil (library.lua), so a call that failed half way holds back
-- nothing of the next.
local held

local function put(...)
  if held then
    held[#held + 1] = {...}
  else
    redis.call(...)
  end
end
