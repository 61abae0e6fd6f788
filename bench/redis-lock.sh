#!/bin/sh
# The do-it-yourself alternative fencerun is compared with: a lock around a command using redis-cli only.
#   redis-lock.sh PORT NAME TTL_MS WAIT COMMAND [ARG...]
# SET NX PX with a random value, run COMMAND, then compare-and-delete with a Lua script (EVAL).
# WAIT=1 retries every 100 ms until the lock is free (a polling waiter); WAIT=0 exits 75 when busy.
# No fencing token, no renewal, no stop before expiry: it is the cheapest correct-looking script.
set -u
port=$1 name=$2 ttl_ms=$3 wait=$4
shift 4
key="bench-lock:{$name}"
read -r value </proc/sys/kernel/random/uuid
while :; do
  reply=$(redis-cli -p "$port" SET "$key" "$value" NX PX "$ttl_ms")
  [ "$reply" = OK ] && break
  [ "$wait" = 1 ] || exit 75
  sleep 0.1
done
"$@"
rc=$?
redis-cli -p "$port" EVAL "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0" \
  1 "$key" "$value" >/dev/null
exit $rc
