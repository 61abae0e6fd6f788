-- Compare-and-delete: deletes the lock only if it still holds our value. KEYS[1] lock; ARGV[1] value.
-- Returns 1 deleted, 0 not ours (gone or another owner's).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
