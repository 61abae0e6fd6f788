-- Quorum mode, round 1 on one server of the quorum: sets the lock if it is absent (or keeps it when
-- this owner already holds it: a retry after a lost reply) and reads this server's token counter and
-- clock, in one atomic step. No token is issued here: the client takes the greatest counter of a
-- majority (round 2, quorum_token.lua).
-- KEYS: 1 lock, 2 token counter. ARGV: 1 the lock value ("<owner> 0 <pid> <host>"), 2 ttl ms, 3 owner.
-- Returns {1 set / 0 held by another, the counter (false when the key is missing), TIME seconds,
--          TIME microseconds, the holder's value (false when set), the holder's PTTL (-2 when set)}.
if redis.replicate_commands then redis.replicate_commands() end
local lock, owner = KEYS[1], ARGV[3]
local set, holder, pttl = 0, false, -2
local current = redis.call('GET', lock)
if not current then
  redis.call('SET', lock, ARGV[1], 'PX', ARGV[2])
  set = 1
elseif string.sub(current, 1, #owner + 1) == owner .. ' ' then
  redis.call('PEXPIRE', lock, ARGV[2])
  set = 1
else
  holder, pttl = current, redis.call('PTTL', lock)
end
local now = redis.call('TIME')
return {set, redis.call('GET', KEYS[2]), now[1], now[2], holder, pttl}
