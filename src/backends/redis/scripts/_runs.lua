-- The record of NAME's runs, shared by the acquire and release scripts (included where they say so).
-- Keys, all under NAME's hash tag (`base` is "<prefix>{NAME}:"):
--   base..'run'   the run in progress: "<owner> <start us> <token> <pid> <host> <version> [<fire us>]"
--   base..'running'  a counting lock's (--limit N) runs in progress: a hash, slot -> the same text
--   base..'ok'    the last successful run's record
--   base..'runs'  the last runs' records, newest first, at most `keep`
-- A record: "<start us> <end us> <outcome> <exit code> <signal> <token> <pid> <host> <version>", '-' for
-- what is not known (a killed run's end, exit code and signal). Times are the server's clock. Every
-- write sets the key's TTL again, so a NAME that stops running leaves nothing after `ttl_ms`.
local function server_now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function push_run(base, record, ttl_ms, keep)
  local list = base .. 'runs'
  redis.call('LPUSH', list, record)
  redis.call('LTRIM', list, 0, keep - 1)
  redis.call('PEXPIRE', list, ttl_ms)
end

-- The lock is free, yet a run is still in progress: it ended without a release (its fencerun was
-- killed, or lost its server until the lease ran out). It is recorded as killed.
-- `self` (quorum mode): the caller's owner id; a run in progress of its own is an earlier attempt of
-- this acquisition that did not get its token confirmed, and is dropped unrecorded.
local function record_killed(base, ttl_ms, keep, self)
  local run = redis.call('GET', base .. 'run')
  if not run then return end
  redis.call('DEL', base .. 'run')
  local owner, start, token, pid, host, ver, fire = string.match(run, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) ?(%S*)$')
  if not owner or owner == self then return end
  local record = {start, '-', 'killed', '-', '-', token, pid, host, ver}
  if fire ~= '' then record[10] = fire end
  push_run(base, table.concat(record, ' '), ttl_ms, keep)
end

-- The same for a counting lock (--limit N): a run in progress whose slot is free ended without a release.
local function record_killed_slots(base, slot_prefix, ttl_ms, keep)
  local running = base .. 'running'
  local runs = redis.call('HGETALL', running)
  for n = 1, #runs, 2 do
    local slot, run = runs[n], runs[n + 1]
    if redis.call('EXISTS', slot_prefix .. slot) == 0 then
      redis.call('HDEL', running, slot)
      local owner, start, token, pid, host, ver = string.match(run, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
      if owner then
        push_run(base, table.concat({start, '-', 'killed', '-', '-', token, pid, host, ver}, ' '), ttl_ms, keep)
      end
    end
  end
end

-- --min-interval: the last success's record when it started less than `min_ms` before `now_us`.
local function too_recent(base, now_us, min_ms)
  local ok = redis.call('GET', base .. 'ok')
  if not ok then return nil end
  local start = tonumber(string.match(ok, '^(%d+) '))
  if start and now_us - start < min_ms * 1000 then return ok end
  return nil
end

-- --every and --min-interval, judged by the trigger's fire time `fire` (server time of its first
-- request; the rules of src/lease/schedule.hpp). The slot of t (microseconds): floor((t - offset) /
-- period). A record counts for its trigger's fire time (its 10th field), else for its start.
local function slot_of(t, period_ms, offset_ms)
  return math.floor((t - offset_ms * 1000) / (period_ms * 1000))
end

local function record_fire(record)
  local fire = string.match(record, '^%S+ %S+ %S+ %S+ %S+ %S+ %S+ %S+ %S+ (%d+)$')
  return tonumber(fire or string.match(record, '^(%d+) '))
end

-- The record that makes this trigger's run unnecessary, or nil: with --every, a success recorded for
-- the slot of `fire` (the last success, else, for a trigger of an older slot, one of the runs kept);
-- with --min-interval, a last success that started less than min_ms before `fire` (or after it).
local function already_done(base, fire, min_ms, period_ms, offset_ms)
  local ok = redis.call('GET', base .. 'ok')
  if not ok then return nil end
  if period_ms > 0 then
    local k = slot_of(fire, period_ms, offset_ms)
    local last = slot_of(record_fire(ok) or 0, period_ms, offset_ms)
    if last == k then return ok end
    if k < last then
      for _, r in ipairs(redis.call('LRANGE', base .. 'runs', 0, -1)) do
        if string.match(r, '^%S+ %S+ (%S+) ') == 'ok' and slot_of(record_fire(r) or 0, period_ms, offset_ms) == k then
          return r
        end
      end
    end
    return nil
  end
  if min_ms > 0 then
    local start = tonumber(string.match(ok, '^(%d+) '))
    if start and fire - start < min_ms * 1000 then return ok end
  end
  return nil
end

-- Counts a skipped ('skip') or busy ('busy') trigger of the slot `slot` (its start in microseconds, as
-- text: --every, the slot's; --min-interval, the start of the run that made it skip or wait) in
-- base..'triggers': "<slot> <skipped> <busy> <last host> <last us>", newest slot first, at most `keep`
-- slots, living as long as the record.
local function note_trigger(base, slot, kind, host, now, ttl_ms, keep)
  local list = base .. 'triggers'
  local head = redis.call('LINDEX', list, 0)
  local now_text = string.format('%.0f', now)
  local s, skipped, busy
  if head then s, skipped, busy = string.match(head, '^(%S+) (%d+) (%d+) ') end
  if s == slot then
    skipped, busy = tonumber(skipped), tonumber(busy)
    if kind == 'skip' then skipped = skipped + 1 else busy = busy + 1 end
    redis.call('LSET', list, 0, table.concat({slot, skipped, busy, host, now_text}, ' '))
  else
    local entry = {slot, 1, 0, host, now_text}
    if kind ~= 'skip' then entry = {slot, 0, 1, host, now_text} end
    redis.call('LPUSH', list, table.concat(entry, ' '))
    redis.call('LTRIM', list, 0, keep - 1)
  end
  redis.call('PEXPIRE', list, ttl_ms)
end

-- Closes the run at its release (release.lua, record.lua): its record, from the arguments a[i] ...
-- a[i + 12]: the key base, the outcome as the caller knows it ('ok', 'failed', 'stopped'), exit code
-- ('-' when unknown), signal ('-' when none), the records' TTL in ms, how many runs are kept, the
-- run's start (server time, microseconds), token, pid, host, fencerun's version, the run's duration
-- (quorum mode, see below), how long the command ran (microseconds; '' unknown), and a[i + 13] when
-- given, its trigger's fire time (--every, --min-interval; '' none), and a[i + 14] when given, the
-- microseconds since the trigger's first request (quorum mode, for a server that has no fire time of
-- its own: it answered none of the trigger's requests before; its time now less that). A run that did not
-- hold the lock any more (`ours` false) and saw 'ok' or 'failed' is recorded as 'lost'; one recorded
-- as killed meanwhile (another run found the lock free) has that record replaced. `slot`: the slot of
-- a counting lock (its run in progress is in the 'running' hash), nil for the plain lock.
local function close_run(ours, owner, a, i, slot)
  local base = a[i]
  local ttl_ms, keep = tonumber(a[i + 4]), tonumber(a[i + 5])
  local outcome = a[i + 1]
  if not ours and outcome ~= 'stopped' then outcome = 'lost' end
  local run
  if slot then run = redis.call('HGET', base .. 'running', slot) else run = redis.call('GET', base .. 'run') end
  local mine = run and string.sub(run, 1, #owner + 1) == owner .. ' '
  local now = server_now_us()
  -- Quorum mode passes no start: each server's own (its clock), from the run in progress it keeps, or
  -- else its time now less the run's duration as the caller measured it (a[i + 11], microseconds).
  local start = a[i + 6]
  if start == '' then
    start = mine and string.match(run, '^%S+ (%S+) ') or string.format('%.0f', now - (tonumber(a[i + 11]) or 0))
  end
  -- The end: the start plus how long the command ran as the caller measured it (a[i + 12],
  -- microseconds), not the time of the release (a caller stopped or starved after its job ended
  -- releases late); the time now when it is not known.
  local finish = now
  local ran = tonumber(a[i + 12])
  if ran and tonumber(start) then finish = math.min(now, tonumber(start) + ran) end
  local fields = {start, string.format('%.0f', finish), outcome, a[i + 2], a[i + 3], a[i + 7], a[i + 8], a[i + 9],
                  a[i + 10]}
  if a[i + 13] and a[i + 13] ~= '' then
    fields[10] = a[i + 13]
  elseif tonumber(a[i + 14] or '') then
    fields[10] = string.format('%.0f', now - tonumber(a[i + 14]))
  end
  local record = table.concat(fields, ' ')
  local replaced = false
  if mine then
    if slot then redis.call('HDEL', base .. 'running', slot) else redis.call('DEL', base .. 'run') end
  else
    local list = base .. 'runs'
    local records = redis.call('LRANGE', list, 0, -1)
    for n, r in ipairs(records) do
      local was, token = string.match(r, '^%S+ %S+ (%S+) %S+ %S+ (%S+) ')
      if was == 'killed' and token == a[i + 7] then
        redis.call('LSET', list, n - 1, record)
        replaced = true
        break
      end
    end
  end
  if not replaced then push_run(base, record, ttl_ms, keep) end
  -- The last success is the one whose trigger fired last: a waiter of an older slot that succeeds
  -- after a newer slot's run does not hide that run.
  if outcome == 'ok' then
    -- (Only a run with a rule has a fire time; one without replaces the last success as it always did.)
    local last = fields[10] and redis.call('GET', base .. 'ok')
    if not last or (record_fire(record) or 0) >= (record_fire(last) or 0) then
      redis.call('SET', base .. 'ok', record, 'PX', ttl_ms)
    else
      redis.call('PEXPIRE', base .. 'ok', ttl_ms)
    end
  end
end
