-- Takes a free slot of a counting lock (--limit N) and issues the next fencing token of NAME, in one
-- atomic step; keeps the wait queue (see _queue.lua and _slots.lua).
-- KEYS: 1 limit, 2 token counter, 3 queue, 4 ticket counter, 5 turns, 6 the plain lock of NAME.
-- ARGV: 1 owner id, 2 ttl ms, 3 pid, 4 host, 5 '1' for fair waiting, 6 '1' when the caller listens on
--       its channel, 7 the waiters' channel prefix, 8 turn ms, 9 N, 10 the slots' key prefix; to keep
--       the record of runs (see _runs.lua and acquire.lua) also: 11 the key base of NAME's run records,
--       12 --min-interval in ms ('0': none), 13 the records' TTL in ms, 14 how many runs are kept,
--       15 fencerun's version.
-- Acquired: {1, token, slot value, server version, microseconds the server's clock is behind the
--            counter (0 when it is not), slot, the run's start (server time, microseconds; '' when no
--            record is kept)}.
-- Skipped:  as acquire.lua's (--min-interval: a success of any slot counts); nothing is changed but
--           the records of killed runs.
-- Busy:     as acquire.lua's, the PTTL being the shortest of the held slots' (-2 when a slot is free
--            but it is other waiters' turn) and the value that slot's holder's.
-- Another limit: {2, the limit NAME is held with, server version}; nothing is changed. All holders of
-- a lock agree on N: the limit is stored while a slot is held, and a plain holder counts as 1.
-- @include _queue.lua
-- @include _slots.lua
-- @include _token.lua
-- @include _runs.lua
if redis.replicate_commands then redis.replicate_commands() end
local version = redis.REDIS_VERSION_NUM or 0
local limit_key, queue, turns = KEYS[1], KEYS[3], KEYS[5]
local owner = ARGV[1]
local fair, queued = ARGV[5] == '1', ARGV[6] == '1'
local wake, turn_ms = ARGV[7], tonumber(ARGV[8])
local n, slot_prefix = tonumber(ARGV[9]), ARGV[10]

if redis.call('EXISTS', KEYS[6]) == 1 then return {2, 1, version} end
local stored = tonumber(redis.call('GET', limit_key) or '')
if stored ~= n then
  if stored and stored > 1 and any_held(slot_prefix, stored) then return {2, stored, version} end
  redis.call('SET', limit_key, n)
end

local now = now_ms()
if queued or fair then expire_turns(queue, turns, turn_ms, now) end
local free, soonest, soonest_slot = scan(slot_prefix, n)

local function busy(turn_left)
  local pttl = soonest or -1
  if #free > 0 then pttl = -2 end
  if not queued then
    local holder = false
    if #free == 0 and soonest_slot then holder = redis.call('GET', slot_prefix .. soonest_slot) end
    return {0, pttl, holder, version, turn_left, -1, 0}
  end
  -- A turn it had is used up: the next free slot wakes somebody else.
  redis.call('ZREM', turns, owner)
  local rank, length = place_in_queue(queue, KEYS[4], owner)
  return {0, pttl, false, version, turn_left, rank, length}
end

if #free == 0 then return busy(0) end
if fair then
  -- Free slots go to the waiters one by one in arrival order, so that their tokens are in that order
  -- too: the caller takes one only when nobody waits in front of it (a caller not in the queue has
  -- all of them in front). The first waiter is woken if it was not; its acquisition wakes the next
  -- while slots are left.
  local rank = false
  if queued then rank = redis.call('ZRANK', queue, owner) end
  local ahead = rank or redis.call('ZCARD', queue)
  if ahead > 0 then
    hand_out(queue, turns, wake, turn_ms, 1, now)
    return busy(turn_ms)
  end
end

-- A free slot is this caller's to take: first what the record of runs says (runs in progress whose
-- slot is free ended without a release; --min-interval looks at the last success of any slot).
local base, now_us = ARGV[11], nil
local records_ttl, keep = tonumber(ARGV[13] or ''), tonumber(ARGV[14] or '')
if base and records_ttl and keep then
  now_us = server_now_us()
  record_killed_slots(base, slot_prefix, records_ttl, keep)
  local min_ms = tonumber(ARGV[12]) or 0
  if min_ms > 0 then
    local last = too_recent(base, now_us, min_ms)
    if last then return {3, last, string.format('%.0f', now_us), version} end
  end
end

local text, behind_us = next_token(KEYS[2])
if not text then return behind_us end
local slot = free[1]
local value = owner .. ' ' .. text .. ' ' .. ARGV[3] .. ' ' .. ARGV[4]
redis.call('SET', slot_prefix .. slot, value, 'PX', ARGV[2])
local started = ''
if now_us then
  started = string.format('%.0f', now_us)
  redis.call('HSET', base .. 'running', slot,
             table.concat({owner, started, text, ARGV[3], ARGV[4], ARGV[15]}, ' '))
  redis.call('PEXPIRE', base .. 'running', records_ttl)
end
if queued then
  redis.call('ZREM', queue, owner)
  redis.call('ZREM', turns, owner)
end
if #free > 1 then
  -- Slots are still free (newcomers took the ones waiters were woken for): wake as many waiters.
  hand_out(queue, turns, wake, turn_ms, #free - 1, now)
else
  -- Every slot is held now: the first waiter looks again when the shortest lease runs out.
  local pttl = tonumber(ARGV[2])
  if soonest and soonest < pttl then pttl = soonest end
  tell_first(queue, wake, pttl)
end
return {1, text, value, version, behind_us, slot, started}
