-- The record of NAME's runs, shared by the acquire and release scripts (included where they say so).
-- Keys, all under NAME's hash tag (`base` is "<prefix>{NAME}:"):
--   base..'run'   the run in progress: "<owner> <start us> <token> <pid> <host> <version>"
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
local function record_killed(base, ttl_ms, keep)
  local run = redis.call('GET', base .. 'run')
  if not run then return end
  redis.call('DEL', base .. 'run')
  local owner, start, token, pid, host, ver = string.match(run, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  if not owner then return end
  push_run(base, table.concat({start, '-', 'killed', '-', '-', token, pid, host, ver}, ' '), ttl_ms, keep)
end

-- --min-interval: the last success's record when it started less than `min_ms` before `now_us`.
local function too_recent(base, now_us, min_ms)
  local ok = redis.call('GET', base .. 'ok')
  if not ok then return nil end
  local start = tonumber(string.match(ok, '^(%d+) '))
  if start and now_us - start < min_ms * 1000 then return ok end
  return nil
end

-- Closes the run at its release (release.lua, record.lua): its record, from the arguments a[i] ...
-- a[i + 10]: the key base, the outcome as the caller knows it ('ok', 'failed', 'stopped'), exit code
-- ('-' when unknown), signal ('-' when none), the records' TTL in ms, how many runs are kept, the
-- run's start (server time, microseconds), token, pid, host, fencerun's version. A run that did not
-- hold the lock any more (`ours` false) and saw 'ok' or 'failed' is recorded as 'lost'; one recorded
-- as killed meanwhile (another run found the lock free) has that record replaced.
local function close_run(ours, owner, a, i)
  local base = a[i]
  local ttl_ms, keep = tonumber(a[i + 4]), tonumber(a[i + 5])
  local outcome = a[i + 1]
  if not ours and outcome ~= 'stopped' then outcome = 'lost' end
  local record = table.concat({a[i + 6], string.format('%.0f', server_now_us()), outcome, a[i + 2], a[i + 3],
                               a[i + 7], a[i + 8], a[i + 9], a[i + 10]}, ' ')
  local run = redis.call('GET', base .. 'run')
  local replaced = false
  if run and string.sub(run, 1, #owner + 1) == owner .. ' ' then
    redis.call('DEL', base .. 'run')
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
  if outcome == 'ok' then redis.call('SET', base .. 'ok', record, 'PX', ttl_ms) end
end
