-- Compare-and-delete: deletes the lock only if it still holds our owner id, and wakes the first waiter.
-- KEYS: 1 lock, 2 queue, 3 turn (only the lock while a Cluster slot migrates: then nobody is woken);
-- ARGV: 1 owner, 2 waiters' channel prefix, 3 turn ms.
-- The owner id (128 random bits) is the first word of the lock value, so a caller that lost track of the
-- full value (an acquire whose reply timed out) can still release what it may hold, and nothing else.
-- Returns 1 deleted, 0 not ours (gone or another owner's).
-- @include _queue.lua
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('DEL', KEYS[1])
  if KEYS[2] then wake_first(KEYS[2], KEYS[3], ARGV[2], tonumber(ARGV[3])) end
  return 1
end
return 0
