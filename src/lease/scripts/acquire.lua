-- Sets the lock only if it is absent and issues the next fencing token, in one atomic step.
-- KEYS[1] lock, KEYS[2] token counter; ARGV[1] owner id, ARGV[2] ttl ms, ARGV[3] pid, ARGV[4] host.
-- Acquired: {1, token, lock value, server version}. Busy: {0, holder's PTTL, holder's value, version}.
-- token = max(counter + 1, server time in microseconds), so tokens never go backwards even when the
-- counter key was lost; it is returned as a string so it always prints as a plain integer.
if redis.replicate_commands then redis.replicate_commands() end
local version = redis.REDIS_VERSION_NUM or 0
local holder = redis.call('GET', KEYS[1])
if holder then
  return {0, redis.call('PTTL', KEYS[1]), holder, version}
end
local last = redis.call('GET', KEYS[2])
local counter = 0
if last then
  counter = tonumber(last)
  if not counter then
    return redis.error_reply('FENCERUN token key ' .. KEYS[2] .. ' does not hold a number')
  end
end
local now = redis.call('TIME')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
if counter + 1 > token then token = counter + 1 end
if token >= 9007199254740992 then
  return redis.error_reply('FENCERUN token for ' .. KEYS[2] .. ' would pass 2^53')
end
local text = string.format('%.0f', token)
redis.call('SET', KEYS[2], text)
local value = ARGV[1] .. ' ' .. text .. ' ' .. ARGV[3] .. ' ' .. ARGV[4]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {1, text, value, version}
