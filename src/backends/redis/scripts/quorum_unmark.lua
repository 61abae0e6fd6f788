-- Quorum mode: a failed attempt takes back the epoch marker it created on one server (deletes it if
-- it still holds the value that attempt created), so that servers that were only touched by refused
-- attempts still look untouched: a new lock's first run counts every server once all of them answer
-- (quorum_lease.cpp). A server whose marker is taken back only looks as if it lost NAME's data later
-- than it did, which makes its quarantine longer, never shorter.
-- KEYS: 1 epoch marker. ARGV: 1 the marker value the attempt created. Returns 1 deleted, 0 not.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
