-- Raises NAME's token counter to at least ARGV[1], so that the next token is greater than it (the
-- recovery when the token source went backwards: see docs/fencing.md). Never lowers it.
-- KEYS: 1 token counter. Returns {counter before (-1 when absent), counter after}, as strings.
if redis.replicate_commands then redis.replicate_commands() end
local last = redis.call('GET', KEYS[1])
local counter = -1
if last then
  counter = tonumber(last)
  if not counter then
    return redis.error_reply('FENCERUN token key ' .. KEYS[1] .. ' does not hold a number')
  end
end
local above = tonumber(ARGV[1])
if counter < above then
  redis.call('SET', KEYS[1], ARGV[1])
  return {string.format('%.0f', counter), ARGV[1]}
end
return {string.format('%.0f', counter), string.format('%.0f', counter)}
