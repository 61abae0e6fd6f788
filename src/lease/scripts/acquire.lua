-- Sets the lock only if it is absent and issues the next fencing token, in one atomic step.
-- KEYS: 1 lock, 2 token counter, 3 fair queue, 4 fair liveness, 5 fair ticket counter.
-- ARGV: 1 owner id, 2 ttl ms, 3 pid, 4 host, 5 '1' for fair (queued) waiting, 6 waiter liveness ms.
-- Acquired: {1, token, lock value, server version,
--            microseconds by which the server's clock is behind the counter (0 when it is not)}.
-- Busy:     {0, holder's PTTL (-2 when free but another waiter's turn), holder's value, version,
--            ms until that waiter's place expires (0 when the lock is held)}.
-- token = max(counter + 1, server time in microseconds), returned as a string so it always prints as
-- a plain integer. While the counter survives, tokens increase. When it was lost (a restart without
-- persistence, a failover to a replica that missed the last write) the clock is the only floor, and it
-- holds only if this server's clock is ahead of the last token issued. A clock found behind the
-- counter is reported: it would not have protected a lost counter.
if redis.replicate_commands then redis.replicate_commands() end
local version = redis.REDIS_VERSION_NUM or 0
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local owner = ARGV[1]
local fair = ARGV[5] == '1'

if fair then
  -- Take a ticket once, refresh our place, and drop waiters at the head whose place expired
  -- (they died or gave up without leaving).
  local queue, alive, tickets = KEYS[3], KEYS[4], KEYS[5]
  local now_ms = math.floor(now_us / 1000)
  local live = tonumber(ARGV[6])
  if not redis.call('ZSCORE', queue, owner) then
    redis.call('ZADD', queue, redis.call('INCR', tickets), owner)
  end
  redis.call('ZADD', alive, now_ms + live, owner)
  redis.call('PEXPIRE', queue, live * 4)
  redis.call('PEXPIRE', alive, live * 4)
  redis.call('PEXPIRE', tickets, live * 4)
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if head == nil or head == owner then break end
    local expires = tonumber(redis.call('ZSCORE', alive, head) or '0')
    if expires >= now_ms then
      local holder = redis.call('GET', KEYS[1])
      if holder then return {0, redis.call('PTTL', KEYS[1]), holder, version, 0} end
      return {0, -2, false, version, expires - now_ms + 1}
    end
    redis.call('ZREM', queue, head)
    redis.call('ZREM', alive, head)
  end
end

local holder = redis.call('GET', KEYS[1])
if holder then
  return {0, redis.call('PTTL', KEYS[1]), holder, version, 0}
end
local last = redis.call('GET', KEYS[2])
local counter = 0
if last then
  counter = tonumber(last)
  if not counter then
    return redis.error_reply('FENCERUN token key ' .. KEYS[2] .. ' does not hold a number')
  end
end
local token = now_us
if counter + 1 > token then token = counter + 1 end
local behind_us = 0
if now_us < counter then behind_us = counter - now_us end
if token >= 9007199254740992 then
  return redis.error_reply('FENCERUN token for ' .. KEYS[2] .. ' would pass 2^53')
end
local text = string.format('%.0f', token)
redis.call('SET', KEYS[2], text)
local value = owner .. ' ' .. text .. ' ' .. ARGV[3] .. ' ' .. ARGV[4]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
if fair then
  redis.call('ZREM', KEYS[3], owner)
  redis.call('ZREM', KEYS[4], owner)
end
return {1, text, value, version, behind_us}
