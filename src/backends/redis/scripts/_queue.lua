-- The wait queue, shared by the acquire, release and leave scripts (included where they say so).
-- `queue` is a sorted set of the waiters' owner ids by ticket; each waiter listens on a channel of
-- its own, `wake .. owner`, and joins the queue only after it subscribed, so a queued waiter that
-- nobody listens for (PUBLISH reaches no one) is gone: its connection closed, it died. `turn` holds
-- the owner woken to take a free lock, for 2 * turn_ms: its turn is the first half, and the second
-- half remembers that it had one (a fair waiter then skips it). A PUBLISH the caller may not make
-- (an ACL user without channel permissions) must not fail a release, nor drop a waiter that may
-- well listen: it is -1, and the waiters are left to their own timers.

local function publish(channel, message)
  local n = redis.pcall('PUBLISH', channel, message)
  if type(n) == 'number' then return n end
  return -1
end

-- The caller's place in the queue (0 first) and the queue's length; a caller not in the queue joins
-- it at the end, with the next ticket.
local function place_in_queue(queue, tickets, owner)
  local rank = redis.call('ZRANK', queue, owner)
  local length = redis.call('ZCARD', queue)
  if not rank then
    redis.call('ZADD', queue, redis.call('INCR', tickets), owner)
    rank, length = length, length + 1
  end
  return rank, length
end

-- Wakes the first waiter that listens ('go'), gives it the turn, and tells the one behind it when to
-- step in if the first does not come ('backup MS'). Waiters found gone are dropped on the way.
-- Returns the owner woken, or nil when nobody waits.
local function wake_first(queue, turn, wake, turn_ms)
  while true do
    local first = redis.call('ZRANGE', queue, 0, 1)
    local head = first[1]
    if not head then return nil end
    local reached = publish(wake .. head, 'go')
    if reached < 0 then return nil end
    if reached > 0 then
      redis.call('SET', turn, head, 'PX', 2 * turn_ms)
      if first[2] then publish(wake .. first[2], 'backup ' .. turn_ms) end
      return head
    end
    redis.call('ZREM', queue, head)
  end
end

-- Tells the first waiter that it is first while the lock is held, and for how long the holder's
-- lease runs ('head MS'): it then looks again when that time is up, in case the holder died.
local function tell_first(queue, wake, pttl)
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then return end
    if publish(wake .. head, 'head ' .. pttl) ~= 0 then return end
    redis.call('ZREM', queue, head)
  end
end
