-- Compare-and-delete: deletes the lock only if it still holds our owner id, and wakes the first waiter.
-- KEYS: 1 lock, 2 queue, 3 turn (only the lock while a Cluster slot migrates: then nobody is woken);
-- ARGV: 1 owner, 2 waiters' channel prefix, 3 turn ms; to record the run (see _runs.lua) also:
--       4 the key base of NAME's run records, 5 the outcome as the caller knows it ('ok', 'failed',
--       'stopped'), 6 the command's exit code ('-' when unknown), 7 its signal ('-' when none), 8 the
--       records' TTL in ms, 9 how many runs are kept, 10 the run's start (server time, microseconds),
--       11 token, 12 pid, 13 host, 14 fencerun's version ('' for 10: quorum mode, where each server's
--       own start is used; then 15 the run's duration in microseconds, for a server that has none), 16 how
--       long the command ran in microseconds (the record's end is the start plus this; '' unknown),
--       17 the trigger's fire time (--every, --min-interval; '' none), 18 (quorum mode, with 17 '')
--       the microseconds since the trigger's first request: the fire time is the server's time less it.
-- The owner id (128 random bits) is the first word of the lock value, so a caller that lost track of the
-- full value (an acquire whose reply timed out) can still release what it may hold, and nothing else.
-- The record is written in the same step: a run that did not hold the lock any more ('ok' or 'failed'
-- as its caller saw it) is recorded as 'lost'; one recorded as killed meanwhile (another run found the
-- lock free) has that record replaced.
-- Returns 1 deleted, 0 not ours (gone or another owner's).
-- @include _queue.lua
-- @include _runs.lua
local v = redis.call('GET', KEYS[1])
local ours = v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' '
if ours then
  redis.call('DEL', KEYS[1])
  if KEYS[2] then wake_first(KEYS[2], KEYS[3], ARGV[2], tonumber(ARGV[3])) end
end
if ARGV[4] then close_run(ours, ARGV[1], ARGV, 4) end
if ours then return 1 end
return 0
