-- The next fencing token of NAME, shared by the acquire scripts (included where they say so).
-- token = max(counter + 1, server time in microseconds), kept in `counter_key` as a string so that it
-- always prints as a plain integer. Returns the token's text and the microseconds by which the
-- server's clock is behind the counter (0 when it is not), or nil and an error reply.
local function next_token(counter_key)
  local last = redis.call('GET', counter_key)
  local counter = 0
  if last then
    counter = tonumber(last)
    if not counter then
      return nil, redis.error_reply('FENCERUN token key ' .. counter_key .. ' does not hold a number')
    end
  end
  local now = redis.call('TIME')
  local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local token = now_us
  if counter + 1 > token then token = counter + 1 end
  local behind_us = 0
  if now_us < counter then behind_us = counter - now_us end
  if token >= 9007199254740992 then
    return nil, redis.error_reply('FENCERUN token for ' .. counter_key .. ' would pass 2^53')
  end
  local text = string.format('%.0f', token)
  redis.call('SET', counter_key, text)
  return text, behind_us
end
