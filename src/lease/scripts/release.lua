-- Compare-and-delete: deletes the lock only if it still holds our owner id, and wakes the waiters.
-- KEYS[1] lock; ARGV[1] owner, ARGV[2] the channel waiters listen on.
-- The owner id (128 random bits) is the first word of the lock value, so a caller that lost track of the
-- full value (an acquire whose reply timed out) can still release what it may hold, and nothing else.
-- Returns 1 deleted, 0 not ours (gone or another owner's).
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
