-- Quorum mode, round 2 on one server of the quorum: writes the token back, raise-only
-- (counter = max(counter, token)), and puts it into the lock value, but only where this owner's
-- lease is present. A server that lost the lease (a restart without its data) gets nothing: a late
-- write-back of an old acquisition cannot raise a repaired counter to a stale value it never had.
-- For a new lock (ARGV 4 = "1": every server answered round 1, none had a counter or a marker that
-- counts),
-- the marker is marked "G": this server has kept NAME's data since the lock was first used.
-- With the record of runs kept, the run in progress is recorded here too (see _runs.lua), its start
-- this server's time now. With a rule (--every, --min-interval) the run in progress also has the
-- trigger's fire time on this server's clock, and the rule is stored beside the record (where the lock
-- is taken, as one server's acquire.lua does): the triggers that come later are compared with it.
-- KEYS: 1 lock, 2 token counter, 3 epoch marker. ARGV: 1 owner, 2 token, 3 the lock value with the
-- token, 4 "1" for a new lock / "0"; to keep the record of runs also: 5 the key base of NAME's run
-- records, 6 the records' TTL in ms, 7 pid, 8 host, 9 fencerun's version; with a rule also: 10 the
-- rule ('': none), 11 the trigger's fire time on this server ('': not known), 12 the microseconds since
-- the trigger's first request (when 11 is '': the fire time is this server's time now less that).
-- Returns {1 written / 0 not ours here, the epoch marker (false when missing), the run's start (this
--          server's time in microseconds; false when not written or no record kept), the fire time
--          here (false when not written or without a rule)}.
if redis.replicate_commands then redis.replicate_commands() end
local lock, owner = KEYS[1], ARGV[1]
local current = redis.call('GET', lock)
local epoch = redis.call('GET', KEYS[3])
if not current or string.sub(current, 1, #owner + 1) ~= owner .. ' ' then return {0, epoch, false} end
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
if not counter then
  return redis.error_reply('FENCERUN token key ' .. KEYS[2] .. ' does not hold a number')
end
if tonumber(ARGV[2]) > counter then redis.call('SET', KEYS[2], ARGV[2]) end
local pttl = redis.call('PTTL', lock)
if pttl > 0 then redis.call('SET', lock, ARGV[3], 'PX', pttl) end
if ARGV[4] == '1' and epoch and string.sub(epoch, 1, 1) ~= 'G' then
  epoch = 'G' .. epoch
  redis.call('SET', KEYS[3], epoch)
end
local started, fire = false, false
if ARGV[5] and ARGV[5] ~= '' then
  local now = redis.call('TIME')
  started = now[1] .. string.format('%06d', tonumber(now[2]))
  local run = {owner, started, ARGV[2], ARGV[7], ARGV[8], ARGV[9]}
  local rule = ARGV[10] or ''
  if rule ~= '' then
    fire = string.format('%.0f', tonumber(ARGV[11] or '') or (tonumber(started) - (tonumber(ARGV[12] or '') or 0)))
    run[7] = fire
    redis.call('SET', ARGV[5] .. 'rule', rule, 'PX', ARGV[6])
  end
  redis.call('SET', ARGV[5] .. 'run', table.concat(run, ' '), 'PX', ARGV[6])
end
return {1, epoch, started, fire}
