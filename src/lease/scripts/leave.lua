-- A fair waiter that gives up leaves the queue at once (instead of waiting for its place to expire).
-- KEYS: 1 fair queue, 2 fair liveness; ARGV[1] owner id.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
