-- Quorum mode: extends the lease on one server of the quorum if it still holds this owner's lease.
-- The owner id decides, not the whole value: a server the token write-back did not reach still has
-- the value of round 1.
-- KEYS[1] lock; ARGV[1] owner, ARGV[2] ttl ms. Returns 1 renewed, 0 gone, -1 held by another owner.
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if v then return -1 end
return 0
