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
-- free (set now) is recorded as killed here; with --min-interval the last success recorded here is
-- returned (the client takes the newest by token of the servers' and compares it with that server's
-- clock).
-- KEYS: 1 lock, 2 token counter, 3 epoch marker.
-- ARGV: 1 the lock value ("<owner> 0 <pid> <host>"), 2 ttl ms, 3 owner, 4 a random word; to keep the
--       record of runs also: 5 the key base of NAME's run records, 6 --min-interval in ms ('0': none),
--       7 the records' TTL in ms, 8 how many runs are kept.
-- Returns {1 set / 0 held by another, the counter (false when the key is missing), TIME seconds,
--          TIME microseconds, the holder's value (false when set), the holder's PTTL (-2 when set),
--          the epoch marker, 1 when the marker was created by this call / 0, the last success's record
--          (false when none, or not asked for)}.
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
local set, holder, pttl = 0, false, -2
local current = redis.call('GET', lock)
local base, records_ttl, keep = ARGV[5], tonumber(ARGV[7] or ''), tonumber(ARGV[8] or '')
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
local last_ok = false
if base and (tonumber(ARGV[6]) or 0) > 0 then last_ok = redis.call('GET', base .. 'ok') end
return {set, redis.call('GET', KEYS[2]), now[1], now[2], holder, pttl, epoch, created, last_ok}
