-- Quorum mode: extends the lease on one server of the quorum if it still holds this owner's lease,
-- and sets it again (with the holder's whole value) where it is missing because this server lost
-- NAME's data since the holder last saw it: its epoch marker is not the one the holder saw (or the
-- holder saw none: the server did not answer then). A key that is missing on a server that kept its
-- data expired or was deleted (`break`): that is "gone", as in single-server mode.
-- The owner id decides, not the whole value: a server the token write-back did not reach still has
-- the value of round 1.
-- KEYS: 1 lock, 2 epoch marker. ARGV: 1 owner, 2 ttl ms, 3 the holder's lock value, 4 the epoch
-- marker the holder saw on this server ("" when none; the same marker marked "G" since, by a new
-- lock's write-back, is not a change), 5 a random word (for a marker created here).
-- Returns {1 renewed / 2 set again / 0 gone / -1 held by another owner, the epoch marker, TIME
--          seconds, TIME microseconds}.
if redis.replicate_commands then redis.replicate_commands() end
local now = redis.call('TIME')
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  epoch = now[1] .. string.format('%06d', tonumber(now[2])) .. '-' .. ARGV[5]
  redis.call('SET', KEYS[2], epoch)
end
local v = redis.call('GET', KEYS[1])
local status = 0
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  status = 1
elseif v then
  status = -1
elseif epoch ~= ARGV[4] and epoch ~= 'G' .. ARGV[4] then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  status = 2
end
return {status, epoch, now[1], now[2]}
