-- Fenced command: runs ARGV[2..] only when the token ARGV[1] is not older than the greatest token the
-- fence key KEYS[1] has accepted, and records the token, in one atomic step.
-- Returns {0, accepted} when the token is stale (nothing runs), else {1, reply of the command}; an
-- error reply of the command comes back as that element and records nothing.
-- Tokens are decimal integers below 2^53, exact in Lua numbers.
if redis.replicate_commands then redis.replicate_commands() end
local token = tonumber(ARGV[1])
if not string.match(ARGV[1], '^%d+$') or not token or token < 1 or token >= 9007199254740992 then
  return redis.error_reply('FENCERUN malformed token ' .. ARGV[1])
end
if #ARGV < 2 then
  return redis.error_reply('FENCERUN no command to run')
end
local accepted = redis.call('GET', KEYS[1])
local current = 0
if accepted then
  current = tonumber(accepted)
  if not current then
    return redis.error_reply('FENCERUN fence key ' .. KEYS[1] .. ' does not hold a token')
  end
  if token < current then
    return {0, accepted}
  end
end
local reply = redis.pcall(unpack(ARGV, 2))
if type(reply) == 'table' and reply.err then
  return {1, reply}
end
if token > current then
  redis.call('SET', KEYS[1], ARGV[1])
end
return {1, reply}
