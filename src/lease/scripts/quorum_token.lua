-- Quorum mode, round 2 on one server of the quorum: writes the token back, raise-only
-- (counter = max(counter, token)), and puts it into the lock value, but only where this owner's
-- lease is present. A server that lost the lease (a restart without its data) gets nothing: a late
-- write-back of an old acquisition cannot raise a repaired counter to a stale value it never had.
-- KEYS: 1 lock, 2 token counter. ARGV: 1 owner, 2 token, 3 the lock value with the token.
-- Returns 1 written, 0 not ours here.
if redis.replicate_commands then redis.replicate_commands() end
local lock, owner = KEYS[1], ARGV[1]
local current = redis.call('GET', lock)
if not current or string.sub(current, 1, #owner + 1) ~= owner .. ' ' then return 0 end
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
if not counter then
  return redis.error_reply('FENCERUN token key ' .. KEYS[2] .. ' does not hold a number')
end
if tonumber(ARGV[2]) > counter then redis.call('SET', KEYS[2], ARGV[2]) end
local pttl = redis.call('PTTL', lock)
if pttl > 0 then redis.call('SET', lock, ARGV[3], 'PX', pttl) end
return 1
