-- After a release by DELEX (which cannot wake anyone): wakes the first waiter if the lock is free.
-- KEYS: 1 lock, 2 queue, 3 turn; ARGV: 1 waiters' channel prefix, 2 turn ms.
-- @include _queue.lua
if redis.call('EXISTS', KEYS[1]) == 0 then wake_first(KEYS[2], KEYS[3], ARGV[1], tonumber(ARGV[2])) end
return 1
