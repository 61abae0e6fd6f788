#!/usr/bin/env bash
# Several holders of one lock at once (--limit N): hand-over rate with 16 contenders at --limit 1, 2
# and 4, next to flock(1) (N lock files, see below) and a redis-cli client that polls N slots; and
# Redis commands per hand-over for fencerun with 16 and 64 contenders (it must not grow with the
# number of waiters). A benchmark, not a test. Run it after building:
#   cmake -S . -B build -G Ninja && cmake --build build && bench/limit.sh
# It writes the section between <!-- limit:begin --> and <!-- limit:end --> of docs/benchmarks.md
# (bench/limit.py report) and keeps the results (one JSON file per cell) in a directory it prints.
# It starts only when the 1-minute load average is below MAX_LOAD (it waits up to SETTLE seconds for
# that), and waits for it again before each cell; the load before and after each cell is in the table.
# Takes about 3 to 6 minutes on 2 CPUs, most of it waiting for the load to settle between cells.
# Installs what it needs (apt-get) when it is missing. Environment:
#   FENCERUN=path          binary to measure (default: build/src/fencerun in this checkout)
#   TOOLS="fencerun fencerun-fair flock poll"   LIMITS="1 2 4"   CONTENDERS=16   MANY=64 (0: skip)
#   HOLD_MS=50             how long each run holds its slot;  POLL_MS=100  the polling client's sleep
#   SECONDS_PER_CELL=5     the counted window of a cell (after WARMUP=1.5 s)
#   MAX_LOAD=2  SETTLE=180 the load average to wait for, and for how long at most (seconds)
#   RESULTS=dir            where the JSON goes (default: a new /tmp/fencerun-limit-DATE directory)
#   BENCH_DOC=path         where to write the section (default: docs/benchmarks.md; - prints it only)
#   SMOKE=text             mark the written section as a smoke run (with this note)
# bench/handover.py, bench/waiters.py and bench/startup.sh rewrite docs/benchmarks.md but keep this
# section as it is.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bench="$repo/bench"
fencerun="$(realpath -m "${FENCERUN:-$repo/build/src/fencerun}")"
doc="${BENCH_DOC:-$repo/docs/benchmarks.md}"
tools="${TOOLS:-fencerun fencerun-fair flock poll}"
limits="${LIMITS:-1 2 4}"
contenders="${CONTENDERS:-16}"
many="${MANY:-64}"
hold_ms="${HOLD_MS:-50}"
poll_ms="${POLL_MS:-100}"
cell_seconds="${SECONDS_PER_CELL:-5}"
warmup="${WARMUP:-1.5}"
max_load="${MAX_LOAD:-2}"
settle="${SETTLE:-180}"
results="${RESULTS:-${TMPDIR:-/tmp}/fencerun-limit-$(date -u +%Y%m%dT%H%M%S)}"
command_line="bench/limit.sh"
for v in FENCERUN TOOLS LIMITS CONTENDERS MANY HOLD_MS POLL_MS SECONDS_PER_CELL WARMUP MAX_LOAD; do
  [[ -n "${!v:-}" ]] && command_line="$v=\"${!v}\" $command_line"
done
started=$SECONDS

say() { echo "limit.sh: $*" >&2; }
die() { say "$*"; exit 1; }
usage() { say "$*"; exit 64; }
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"
for t in $tools; do
  case "$t" in fencerun | fencerun-fair | flock | poll) ;; *) usage "unknown tool '$t' in TOOLS" ;; esac
done
for n in $limits; do [[ "$n" =~ ^[1-9][0-9]*$ ]] || usage "bad limit '$n' in LIMITS"; done
for v in "$contenders" "$hold_ms" "$poll_ms"; do [[ "$v" =~ ^[1-9][0-9]*$ ]] || usage "bad number '$v'"; done
[[ "$many" =~ ^[0-9]+$ ]] || usage "bad MANY '$many'"

# --- what it needs --------------------------------------------------------------------------------
source "$bench/lib.sh"
need redis-server redis-server
need redis-cli redis-tools
need flock util-linux
need python3 python3
need bash bash
install_missing
unset FENCERUN_REDIS_URL REDIS_URL REDISCLI_AUTH FENCERUN_REDIS_PASSWORD FENCERUN_TOKEN FENCERUN_SLOT
export LC_ALL=C  # $EPOCHREALTIME with a decimal point

# --- the load ---------------------------------------------------------------------------------------
load1() { cut -d' ' -f1 /proc/loadavg; }
below() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
waited=0
until below "$(load1)" "$max_load"; do
  ((waited >= settle)) && die "the load average is $(cut -d' ' -f1-3 /proc/loadavg), not below $max_load after ${settle} s: not measuring"
  ((waited == 0)) && say "waiting for the load average ($(load1)) to fall below $max_load"
  sleep 5
  waited=$((waited + 5))
done

# --- server and clients ---------------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/fencerun-limit.XXXXXX")"
redis_pid="" py_pid=""
cleanup() {
  set +e
  trap - INT TERM
  if [[ -n "$py_pid" ]] && kill -0 "$py_pid" 2>/dev/null; then
    kill "$py_pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$py_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$py_pid" 2>/dev/null
  fi
  if [[ -n "$redis_pid" ]]; then
    kill "$redis_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$redis_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

redis_port="$(free_port)"; taken+="$redis_port "
url="redis://127.0.0.1:$redis_port"
start_redis --maxclients 4096
say "redis-server on $redis_port (pid $redis_pid), work dir $work"

# The polling client: a slot is one key, taken with SET NX PX; no token, no renewal.
#   poll-slots.sh PORT NAME N POLL_MS TTL_MS COMMAND [ARG...]
poll_script="$work/poll-slots.sh"
cat >"$poll_script" <<'EOF'
#!/bin/sh
set -u
port=$1 name=$2 n=$3 poll_ms=$4 ttl_ms=$5
shift 5
key="bench-slots:{$name}:slot"
read -r value </proc/sys/kernel/random/uuid
pause=$(awk -v ms="$poll_ms" 'BEGIN { printf "%.3f", ms / 1000 }')
while :; do
  k=0
  while [ "$k" -lt "$n" ]; do
    [ "$(redis-cli -p "$port" SET "$key:$k" "$value" NX PX "$ttl_ms")" = OK ] && break 2
    k=$((k + 1))
  done
  sleep "$pause"
done
BENCH_SLOT=$k "$@"
rc=$?
redis-cli -p "$port" EVAL "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0" \
  1 "$key:$k" "$value" >/dev/null
exit $rc
EOF

# Every tool must work once before anything is timed.
for n in $limits; do
  if [[ " $tools " == *" fencerun"* ]]; then
    "$fencerun" -r "$url" --limit "$n" "bench-check-$n" -- true || die "fencerun --limit $n -- true failed"
  fi
  sh "$poll_script" "$redis_port" "bench-check-$n" "$n" "$poll_ms" 30000 true || die "the polling client failed"
done
flock "$work/flock-check" true || die "flock true failed"

# --- the sweep ------------------------------------------------------------------------------------
mkdir -p "$results"
csv() { tr -s ' \t\n' '\n' <<<"$1" | grep . | paste -sd, -; }
uptime_start="$(uptime)"
date_start="$(date -u +%Y-%m-%dT%H:%MZ)"
say "results in $results; tools: $tools; limits: $limits; $contenders contenders (and $many); $uptime_start"
python3 "$bench/limit.py" sweep --fencerun "$fencerun" --redis-port "$redis_port" --poll-script "$poll_script" \
  --poll-ms "$poll_ms" --work "$work" --results "$results" --tools "$(csv "$tools")" --limits "$(csv "$limits")" \
  --contenders "$contenders" --many "$many" --hold-ms "$hold_ms" --seconds "$cell_seconds" --warmup "$warmup" \
  --max-load "$max_load" --settle "$settle" &
py_pid=$!
wait "$py_pid" || die "limit.py sweep failed (exit $?)"
py_pid=""

# --- report ---------------------------------------------------------------------------------------
python3 - "$results/meta.json" <<EOF
import json, sys
meta = {
  "command": """$command_line""",
  "date": """$date_start""",
  "nproc": """$(nproc)""",
  "cpu": """$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')""",
  "kernel": """$(uname -r)""",
  "uptime_start": """$(sed 's/^ *//' <<<"$uptime_start")""",
  "uptime_end": """$(uptime | sed 's/^ *//')""",
  "fencerun_version": """$("$fencerun" --version | head -1)""",
  "redis_version": """$(redis-server --version | cut -d' ' -f1-3)""",
  "flock_version": """$(flock --version | head -1)""",
  "binary": """${FENCERUN:-build/src/fencerun}""",
  "revision": """$(git -C "$repo" rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /' || echo 'an unknown revision')$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo ' with uncommitted changes' || true)""",
  "warmup": "$warmup",
  "seconds": "$cell_seconds",
  "poll_ms": $poll_ms,
  "max_load": "$max_load",
  "settle": "$settle",
  "smoke": """${SMOKE:-}""",
  "seconds_total": $((SECONDS - started)),
}
json.dump(meta, open(sys.argv[1], "w"), indent=1)
EOF
[[ "$doc" == - ]] || mkdir -p "$(dirname "$doc")"
python3 "$bench/limit.py" report --results "$results" --doc "$doc"
say "wrote the --limit section of $doc in $((SECONDS - started)) s; results kept in $results"
