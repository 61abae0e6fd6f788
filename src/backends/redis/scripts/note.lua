-- Counts a trigger that ends without running: busy (the wait ran out, or no wait), or skipped because
-- the holder runs its run (decided by the caller from the busy reply), in NAME's record of triggers.
-- KEYS: 1 the lock (it routes the call in a Cluster; not touched).
-- ARGV: 1 the key base of NAME's run records ("<prefix>{NAME}:"), 2 the slot (microseconds, text; see
--       note_trigger), 3 'skip' or 'busy', 4 host, 5 the records' TTL in ms, 6 how many slots are kept.
-- Returns 1.
-- @include _runs.lua
if redis.replicate_commands then redis.replicate_commands() end
note_trigger(ARGV[1], ARGV[2], ARGV[3], ARGV[4], server_now_us(), tonumber(ARGV[5]), tonumber(ARGV[6]))
return 1
