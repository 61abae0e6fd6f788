-- Sets the lock only if it is absent and issues the next fencing token, in one atomic step; keeps the
-- wait queue (see _queue.lua).
-- KEYS: 1 lock, 2 token counter, 3 queue, 4 ticket counter, 5 turn.
-- ARGV: 1 owner id, 2 ttl ms, 3 pid, 4 host, 5 '1' for fair waiting, 6 '1' when the caller listens on
--       its channel (it joins the queue, or keeps its place), 7 the waiters' channel prefix, 8 turn ms,
--       9 the key of NAME's stored limit, 10 the key prefix of its slots (see slots_acquire.lua),
--       11 the key base of NAME's run records ("<prefix>{NAME}:", see _runs.lua), 12 --min-interval in ms
--       ('0': none), 13 the records' TTL in ms, 14 how many runs are kept, 15 fencerun's version,
--       16 --every in ms ('0': none), 17 --slot-offset in ms, 18 the trigger's fire time (server
--       microseconds from its first request; '': now), 19 the rule its triggers share ('': none; see
--       src/lease/schedule.hpp's schedule_rule), 20 '1' for --if-record-lost skip.
-- The record's marker, <base>since (the server time its first run with a rule took the lock; no TTL,
-- as the token counter): while it is missing, the record is new or was lost with the server's data.
-- Acquired: {1, token, lock value, server version,
--            microseconds by which the server's clock is behind the counter (0 when it is not),
--            0 (the slot), the run's start (server time, microseconds), the fire time,
--            1 when the record's marker was missing (this run starts the record), else 0}.
-- No record:{5, server time in microseconds, version}: --if-record-lost skip and the marker is
--            missing; nothing is changed.
-- Skipped:  {3, the record that makes the run unnecessary, server time in microseconds, version, the
--           fire time} (--every: a success of the trigger's slot; --min-interval: a success that
--           started too recently); nothing is changed but a killed run's record.
-- Another rule: {4, the rule NAME's record was written with, version}; nothing is changed.
-- Busy:     {0, holder's PTTL (-2 when free but another waiter's turn), holder's value (false when
--            the caller is queued), version, ms left of that waiter's turn (0 when the lock is held),
--            the caller's place in the queue (0 first, -1 not queued), the queue's length,
--            the server's time (microseconds; '' without a rule), the run in progress (false: none
--            or no rule)}.
-- Another limit: {2, the limit NAME's slots are held with (--limit N), version}; nothing is changed.
-- token = max(counter + 1, server time in microseconds), returned as a string so it always prints as
-- a plain integer. While the counter survives, tokens increase. When it was lost (a restart without
-- persistence, a failover to a replica that missed the last write) the clock is the only floor, and it
-- holds only if this server's clock is ahead of the last token issued. A clock found behind the
-- counter is reported: it would not have protected a lost counter.
-- @include _queue.lua
-- @include _token.lua
-- @include _runs.lua
if redis.replicate_commands then redis.replicate_commands() end
local version = redis.REDIS_VERSION_NUM or 0
local lock, queue, turn = KEYS[1], KEYS[3], KEYS[5]
local owner = ARGV[1]
local fair, queued = ARGV[5] == '1', ARGV[6] == '1'
local wake, turn_ms = ARGV[7], tonumber(ARGV[8])
local base = ARGV[11]
local records_ttl, keep = tonumber(ARGV[13] or ''), tonumber(ARGV[14] or '')
local records = base and records_ttl and keep
local rule = ARGV[19] or ''
-- A trigger with a rule needs the server's time in every answer (its fire time is that of its first
-- request); others read it only once the lock is free, as before.
local ruled = records and rule ~= ''
local now_us = ruled and server_now_us() or nil

-- Triggers of one lock share one rule (--every, --slot-offset, --min-interval, --records-ttl).
if ruled then
  local stored = redis.call('GET', base .. 'rule')
  if stored and stored ~= rule then return {4, stored, version} end
end

-- A busy reply: the caller's place in the queue and the queue's length; a queued caller that is not
-- in the queue joins it at the end. With a rule, the server's time and the run in progress.
local function busy(pttl, holder, turn_left)
  local now_text, run = '', false
  if ruled then
    now_text = string.format('%.0f', now_us)
    run = redis.call('GET', base .. 'run') or false
  end
  if not queued then return {0, pttl, holder, version, turn_left, -1, 0, now_text, run} end
  local rank, length = place_in_queue(queue, KEYS[4], owner)
  return {0, pttl, false, version, turn_left, rank, length, now_text, run}
end

if queued then
  local pttl = redis.call('PTTL', lock)
  if pttl ~= -2 then return busy(pttl, false, 0) end
else
  local holder = redis.call('GET', lock)
  if holder then return busy(redis.call('PTTL', lock), holder, 0) end
end

-- The lock is free. A counting lock of NAME (--limit N) that still has a holder: this run's limit (1)
-- is another one. A stored limit whose slots are all gone binds nobody any more. (Looked at only now:
-- while a Cluster slot migrates, a key the source no longer has cannot be read there, and a held
-- lock must still be reported as busy.)
local stored = tonumber(redis.call('GET', ARGV[9]) or '')
if stored then
  if stored > 1 then
    for i = 0, math.min(stored, 1024) - 1 do
      if redis.call('EXISTS', ARGV[10] .. i) == 1 then return {2, stored, version} end
    end
  end
  redis.call('DEL', ARGV[9])
end

if queued and not fair then
  -- The lock is free and anyone may take it, but a first waiter whose turn ran out (it was woken and
  -- did not come: stopped, or gone without closing its connection) loses its place, or every release
  -- would wake it first again.
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head and head ~= owner and redis.call('GET', turn) == head and redis.call('PTTL', turn) <= turn_ms then
    redis.call('ZREM', queue, head)
  end
elseif fair then
  -- The lock is free. It goes to the first waiter; one whose turn ran out loses its place, and one not
  -- woken yet (the holder's lease ran out) is woken now.
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if head == nil or head == owner then break end
    if redis.call('GET', turn) == head then
      local left = redis.call('PTTL', turn) - turn_ms
      if left > 0 then return busy(-2, false, left) end
      redis.call('ZREM', queue, head)
    else
      local woken = wake_first(queue, turn, wake, turn_ms)
      if woken ~= nil and woken ~= owner then return busy(-2, false, turn_ms) end
      break
    end
  end
end

-- The lock is this caller's to take: first what the record of runs says (a run that ended without a
-- release is recorded as killed; --min-interval looks at the last success).
if records and not now_us then now_us = server_now_us() end
local fire = tonumber(ARGV[18] or '') or now_us
local new_record = 0
if records then
  if rule ~= '' and redis.call('EXISTS', base .. 'since') == 0 then
    if ARGV[20] == '1' then return {5, string.format('%.0f', now_us), version} end
    new_record = 1
  end
  record_killed(base, records_ttl, keep)
  record_killed_slots(base, ARGV[10], records_ttl, keep)
  local min_ms, period_ms, offset_ms = tonumber(ARGV[12]) or 0, tonumber(ARGV[16] or '') or 0, tonumber(ARGV[17] or '') or 0
  if min_ms > 0 or period_ms > 0 then
    local done = already_done(base, fire, min_ms, period_ms, offset_ms)
    if done then
      local slot = string.match(done, '^(%d+) ')
      if period_ms > 0 then
        slot = string.format('%.0f', slot_of(fire, period_ms, offset_ms) * period_ms * 1000 + offset_ms * 1000)
      end
      note_trigger(base, slot, 'skip', ARGV[4], now_us, records_ttl, keep)
      return {3, done, string.format('%.0f', now_us), version, string.format('%.0f', fire)}
    end
  end
  if rule ~= '' then redis.call('SET', base .. 'rule', rule, 'PX', records_ttl) end
end

local text, behind_us = next_token(KEYS[2])
if not text then return behind_us end
local value = owner .. ' ' .. text .. ' ' .. ARGV[3] .. ' ' .. ARGV[4]
redis.call('SET', lock, value, 'PX', ARGV[2])
local started, fired = '', ''
if now_us then
  started = string.format('%.0f', now_us)
  local run = {owner, started, text, ARGV[3], ARGV[4], ARGV[15]}
  if rule ~= '' then
    fired = string.format('%.0f', fire)
    run[7] = fired
  end
  redis.call('SET', base .. 'run', table.concat(run, ' '), 'PX', records_ttl)
  if new_record == 1 then redis.call('SET', base .. 'since', started) end
end
if queued then
  redis.call('ZREM', queue, owner)
  tell_first(queue, wake, ARGV[2])
end
return {1, text, value, version, behind_us, 0, started, fired, new_record}
