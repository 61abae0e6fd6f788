-- Compare-and-delete: deletes the lock only if it still holds our owner id, and wakes the first waiter.
-- KEYS: 1 lock, 2 queue, 3 turn (only the lock while a Cluster slot migrates: then nobody is woken);
-- ARGV: 1 owner, 2 waiters' channel prefix, 3 turn ms; to record the run (see _runs.lua) also:
--       4 the key base of NAME's run records, 5 the outcome as the caller knows it ('ok', 'failed',
--       'stopped'), 6 the command's exit code ('-' when unknown), 7 its signal ('-' when none), 8 the
--       records' TTL in ms, 9 how many runs are kept, 10 the run's start (server time, microseconds),
--       11 token, 12 pid, 13 host, 14 fencerun's version.
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
local base = ARGV[4]
if base then
  local ttl_ms, keep = tonumber(ARGV[8]), tonumber(ARGV[9])
  local outcome = ARGV[5]
  if not ours and outcome ~= 'stopped' then outcome = 'lost' end
  local record = table.concat({ARGV[10], string.format('%.0f', server_now_us()), outcome, ARGV[6], ARGV[7],
                               ARGV[11], ARGV[12], ARGV[13], ARGV[14]}, ' ')
  local run = redis.call('GET', base .. 'run')
  local replaced = false
  if run and string.sub(run, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
    redis.call('DEL', base .. 'run')
  else
    local list = base .. 'runs'
    local records = redis.call('LRANGE', list, 0, -1)
    for i, r in ipairs(records) do
      local was, token = string.match(r, '^%S+ %S+ (%S+) %S+ %S+ (%S+) ')
      if was == 'killed' and token == ARGV[11] then
        redis.call('LSET', list, i - 1, record)
        replaced = true
        break
      end
    end
  end
  if not replaced then push_run(base, record, ttl_ms, keep) end
  if outcome == 'ok' then redis.call('SET', base .. 'ok', record, 'PX', ttl_ms) end
end
if ours then return 1 end
return 0
