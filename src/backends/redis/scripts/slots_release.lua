-- Compare-and-delete of a slot of a counting lock: deletes it only if it holds our owner id, and
-- wakes as many waiters as slots are free. When no slot is held any more, the stored limit goes.
-- KEYS: 1 limit, 2 queue, 3 turns.
-- ARGV: 1 owner, 2 the slot ('' when not known: every slot is looked at), 3 the slots' key prefix,
--       4 N, 5 waiters' channel prefix, 6 turn ms; to record the run (see _runs.lua; only with the slot
--       known) also 7..19 as release.lua's 4..16.
-- Returns 1 deleted, 0 not ours (gone or another owner's).
-- @include _queue.lua
-- @include _slots.lua
-- @include _runs.lua
if redis.replicate_commands then redis.replicate_commands() end
local owner, slot_prefix, n = ARGV[1], ARGV[3], tonumber(ARGV[4])
local function release(key)
  local v = redis.call('GET', key)
  if v and string.sub(v, 1, #owner + 1) == owner .. ' ' then
    redis.call('DEL', key)
    return true
  end
  return false
end
local deleted = false
if ARGV[2] ~= '' then
  deleted = release(slot_prefix .. ARGV[2])
else
  for i = 0, n - 1 do
    if release(slot_prefix .. i) then
      deleted = true
      break
    end
  end
end
if ARGV[7] and ARGV[2] ~= '' then close_run(deleted, owner, ARGV, 7, ARGV[2]) end
if not deleted then return 0 end
local free = scan(slot_prefix, n)
if #free == n then redis.call('DEL', KEYS[1]) end
local turn_ms = tonumber(ARGV[6])
local now = now_ms()
expire_turns(KEYS[2], KEYS[3], turn_ms, now)
hand_out(KEYS[2], KEYS[3], ARGV[5], turn_ms, #free, now)
return 1
