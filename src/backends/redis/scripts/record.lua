-- The record of a run at its release, when the lock itself is deleted by the server's native
-- compare-and-delete (DELIFEQ, DELEX) sent right after this script in the same pipeline (see _runs.lua).
-- KEYS: 1 lock. ARGV: 1 owner id, 2 the full lock value, 3 whether the lock was ours ('1', '0'; '':
-- look: still holding our value, which the delete that follows removes), 4 on as release.lua's.
-- Returns 1 when the lock was ours, else 0.
-- @include _runs.lua
local ours
if ARGV[3] == '1' then
  ours = true
elseif ARGV[3] == '0' then
  ours = false
else
  ours = redis.call('GET', KEYS[1]) == ARGV[2]
end
close_run(ours, ARGV[1], ARGV, 4)
if ours then return 1 end
return 0
