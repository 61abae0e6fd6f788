-- A waiter that gives up (its wait ran out, a signal) leaves the queue at once. When it was first, the
-- next waiter takes its place: woken when the lock is free, told how long the holder's lease runs when
-- it is held.
-- KEYS: 1 lock, 2 queue, 3 turn; ARGV: 1 owner id, 2 waiters' channel prefix, 3 turn ms.
-- @include _queue.lua
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if not rank then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
if rank == 0 then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl == -2 then
    wake_first(KEYS[2], KEYS[3], ARGV[2], tonumber(ARGV[3]))
  else
    tell_first(KEYS[2], ARGV[2], pttl)
  end
end
return 1
