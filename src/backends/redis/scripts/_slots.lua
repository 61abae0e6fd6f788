-- The slots of a counting lock (--limit N), shared by the slots_* scripts (included where they say
-- so; _queue.lua comes first). Slot I is the key `slot_prefix .. I`, a lease like the plain lock's
-- (value "<owner> <token> <pid> <host>", PX ttl). The waiters queue as for the plain lock; `turns`
-- is a sorted set of the waiters woken to take a free slot, scored by the server time (ms) they were
-- woken at: a waiter that does not come within turn_ms loses its turn and its place.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The slots of 0..n-1 that are free, the shortest remaining lease (nil when no held slot expires)
-- and the slot that holds it (or a held slot without expiry when none expires).
local function scan(slot_prefix, n)
  local free, soonest, soonest_slot = {}, nil, nil
  for i = 0, n - 1 do
    local p = redis.call('PTTL', slot_prefix .. i)
    if p == -2 then
      free[#free + 1] = i
    elseif p >= 0 then
      if soonest == nil or p < soonest then soonest, soonest_slot = p, i end
    elseif soonest_slot == nil then
      soonest_slot = i
    end
  end
  return free, soonest, soonest_slot
end

-- Whether any of slots 0..n-1 is held (n as stored with the lock, at most 1024).
local function any_held(slot_prefix, n)
  for i = 0, math.min(n, 1024) - 1 do
    if redis.call('EXISTS', slot_prefix .. i) == 1 then return true end
  end
  return false
end

-- Woken waiters whose turn ran out (stopped, or gone without closing their connection) lose it and
-- their place; one that comes later joins the queue again at its end.
local function expire_turns(queue, turns, turn_ms, now)
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', turns, '-inf', now - turn_ms)) do
    redis.call('ZREM', queue, w)
    redis.call('ZREM', turns, w)
  end
end

-- Sees to it that the first `k` waiters in the queue have a turn: those woken within turn_ms are on
-- their way, the others are woken ('go') now; waiters found gone are dropped on the way. The waiter
-- behind them is told to step in if one of them has not come in turn_ms ('backup MS'). The cost is
-- bounded by k (at most the number of free slots), not by the length of the queue.
local function hand_out(queue, turns, wake, turn_ms, k, now)
  local i, given = 0, 0
  while given < k do
    local head = redis.call('ZRANGE', queue, i, i)[1]
    if not head then return end
    local woken = redis.call('ZSCORE', turns, head)
    if woken and now - tonumber(woken) < turn_ms then
      given, i = given + 1, i + 1
    else
      local reached = publish(wake .. head, 'go')
      if reached < 0 then return end
      if reached > 0 then
        redis.call('ZADD', turns, now, head)
        given, i = given + 1, i + 1
      else
        redis.call('ZREM', queue, head)
        redis.call('ZREM', turns, head)
      end
    end
  end
  local behind = redis.call('ZRANGE', queue, i, i)[1]
  if behind then publish(wake .. behind, 'backup ' .. turn_ms) end
end
