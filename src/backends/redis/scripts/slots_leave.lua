-- A waiter of a counting lock that gives up leaves the queue at once; free slots it may have been
-- woken for go to the waiters behind it, and a new first waiter hears how long the shortest lease runs.
-- KEYS: 1 queue, 2 turns; ARGV: 1 owner id, 2 waiters' channel prefix, 3 turn ms, 4 the slots' key
-- prefix, 5 N.
-- @include _queue.lua
-- @include _slots.lua
if redis.replicate_commands then redis.replicate_commands() end
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
if not rank then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local turn_ms = tonumber(ARGV[3])
local free, soonest = scan(ARGV[4], tonumber(ARGV[5]))
if #free > 0 then
  hand_out(KEYS[1], KEYS[2], ARGV[2], turn_ms, #free, now_ms())
elseif rank == 0 and soonest then
  tell_first(KEYS[1], ARGV[2], soonest)
end
return 1
