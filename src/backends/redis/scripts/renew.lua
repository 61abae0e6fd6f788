-- Extends the lease only if the lock still holds our value.
-- KEYS[1] lock; ARGV[1] our value, ARGV[2] ttl ms. Returns 1 renewed, 0 gone, -1 held by another owner.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if v then return -1 end
return 0
