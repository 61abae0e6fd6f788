-- Quorum mode, round 1 on one server of the quorum: sets the lock if it is absent (or keeps it when
-- this owner already holds it: a retry after a lost reply), reads this server's token counter and
-- clock, and reads (creating it when missing) NAME's epoch marker on this server, in one atomic step.
-- The epoch marker holds the server's TIME in µs when it was created and a random word of the client
-- (so that two servers never hold the same marker: one server reached under two addresses does),
-- "G" in front once the token
-- write-back of a new lock marked it (quorum_token.lua): it is created again after the server lost
-- NAME's data, so its age says how long this server has kept NAME's data without a gap. No token is
-- issued here: the client decides from the replies of every server (quorum_lease.cpp).
-- The record of runs (see _runs.lua), when ARGV 5 is given: a run in progress found with the lock
-- free (set now) is recorded as killed here. With a rule (--every, --min-interval: ARGV 9) the script
-- returns what the client judges by (quorum_lease.cpp, with lease/schedule.hpp's already_done): the
-- last success recorded here, the runs kept (--every), the run in progress (when another holds the
-- lock) and the trigger's fire time on this server's clock; and a server that stores another rule for
-- NAME sets nothing. A server without a stored rule (a new lock, or restarted without its data) is not
-- refused: the token write-back stores it.
-- KEYS: 1 lock, 2 token counter, 3 epoch marker.
-- ARGV: 1 the lock value ("<owner> 0 <pid> <host>"), 2 ttl ms, 3 owner, 4 a random word; to keep the
--       record of runs also: 5 the key base of NAME's run records, 6 --min-interval in ms ('0': none),
--       7 the records' TTL in ms, 8 how many runs are kept; with a rule also: 9 the rule its triggers
--       share (src/lease/schedule.hpp's schedule_rule; '': none), 10 '1' to return the runs kept
--       (--every), 11 the trigger's fire time on this server (microseconds; '': not known yet), 12 the
--       microseconds since the trigger's first request on the client's clock (when 11 is '', the fire
--       time is this server's time now less that).
-- Returns {1 set / 0 held by another, the counter (false when the key is missing), TIME seconds,
--          TIME microseconds, the holder's value (false when set), the holder's PTTL (-2 when set),
--          the epoch marker, 1 when the marker was created by this call / 0, the last success's record
--          (false when none, or not asked for), the rule stored here when it is another one (false
--          otherwise; when given, nothing was set), the fire time here (false without a rule), the
--          runs kept (--every; else empty), the run in progress (false when none or set)}.
-- @include _runs.lua
if redis.replicate_commands then redis.replicate_commands() end
local lock, owner = KEYS[1], ARGV[3]
local now = redis.call('TIME')
local epoch, created = redis.call('GET', KEYS[3]), 0
if not epoch then
  epoch = now[1] .. string.format('%06d', tonumber(now[2])) .. '-' .. ARGV[4]
  redis.call('SET', KEYS[3], epoch)
  created = 1
end
local base, records_ttl, keep = ARGV[5], tonumber(ARGV[7] or ''), tonumber(ARGV[8] or '')
local rule = ARGV[9] or ''
local fire = false
if base and rule ~= '' then
  local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  fire = string.format('%.0f', tonumber(ARGV[11] or '') or (now_us - (tonumber(ARGV[12] or '') or 0)))
  -- Triggers of one lock share one rule (--every, --slot-offset, --min-interval, --records-ttl).
  local stored = redis.call('GET', base .. 'rule')
  if stored and stored ~= rule then
    return {0, redis.call('GET', KEYS[2]), now[1], now[2], false, -2, epoch, created, false, stored, fire, {}, false}
  end
end
local set, holder, pttl = 0, false, -2
local current = redis.call('GET', lock)
if not current then
  redis.call('SET', lock, ARGV[1], 'PX', ARGV[2])
  set = 1
  if base and records_ttl and keep then record_killed(base, records_ttl, keep, owner) end
elseif string.sub(current, 1, #owner + 1) == owner .. ' ' then
  redis.call('PEXPIRE', lock, ARGV[2])
  set = 1
else
  holder, pttl = current, redis.call('PTTL', lock)
end
local last_ok, runs, run = false, {}, false
if base and (rule ~= '' or (tonumber(ARGV[6]) or 0) > 0) then last_ok = redis.call('GET', base .. 'ok') end
if base and rule ~= '' then
  if ARGV[10] == '1' and last_ok then runs = redis.call('LRANGE', base .. 'runs', 0, -1) end
  if set == 0 then run = redis.call('GET', base .. 'run') end
end
return {set, redis.call('GET', KEYS[2]), now[1], now[2], holder, pttl, epoch, created, last_ok, false, fire, runs, run}
