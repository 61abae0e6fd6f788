#!/usr/bin/env bash
# What one hand-over costs as the number of waiters W grows: Redis commands (scripts' own included,
# and client requests alone), server CPU, connections per waiter and hand-over latency, for fencerun,
# fencerun --fair, `etcdctl lock` and flock(1). A benchmark, not a test. Run it after building:
#   cmake -S . -B build -G Ninja && cmake --build build && bench/waiters.sh
# It writes the results (one JSON file per cell) to a results directory that it keeps and prints, then
# the section between <!-- waiters:begin --> and <!-- waiters:end --> of docs/benchmarks.md and
# docs/waiters.png (bench/waiters.py report). Installs what it needs (apt-get) when it is missing.
# Environment:
#   FENCERUN=path          binary to measure (default: build/src/fencerun in this checkout)
#   WAITERS="1 16 100 500 1000"   numbers of waiters
#   TOOLS="fencerun fencerun-fair flock etcd"   (each tool at every W, in this order; before each cell the
#                          sweep waits, up to 300 s, for the load average to fall below the CPUs)
#   WAIT=120s              each waiter's --wait (flock: -w)
#   RESULTS=dir            where the JSON goes (default: a new /tmp/fencerun-waiters-DATE directory)
#   BENCH_DOC, BENCH_PLOT  where to write the section and the plot (default: docs/benchmarks.md, docs/waiters.png)
#   SMOKE=text             mark the written section as a smoke run (with this note)
# A cell whose waiters would not fit in the memory that `free` reports is skipped and shown as such
# (etcdctl is a Go binary of 20+ MiB per waiting process); one that runs MemAvailable under 1 GiB is
# stopped. Takes about 5 to 10 minutes on 2 CPUs (most of it starting and handing over the 500 and
# 1000 waiters of each tool); longer if the machine is busy. etcdctl lock has no wait limit of its own:
# every cell ends at the latest WAIT + 30 s after go, its leftovers killed and the cell marked timeout.
# bench/handover.sh rewrites docs/benchmarks.md but keeps this section as it is.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bench="$repo/bench"
fencerun="$(realpath -m "${FENCERUN:-$repo/build/src/fencerun}")"
doc="${BENCH_DOC:-$repo/docs/benchmarks.md}"
plot="${BENCH_PLOT:-$repo/docs/waiters.png}"
waiters="${WAITERS:-1 16 100 500 1000}"
tools="${TOOLS:-fencerun fencerun-fair flock etcd}"
wait_for="${WAIT:-120s}"
results="${RESULTS:-${TMPDIR:-/tmp}/fencerun-waiters-$(date -u +%Y%m%dT%H%M%S)}"
maxclients=20000
command_line="bench/waiters.sh"
for v in FENCERUN WAITERS TOOLS WAIT; do [[ -n "${!v:-}" ]] && command_line="$v=\"${!v}\" $command_line"; done
started=$SECONDS

say() { echo "waiters.sh: $*" >&2; }
die() { say "$*"; exit 1; }
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"
for t in $tools; do
  case "$t" in fencerun | fencerun-fair | etcd | flock) ;; *) die "unknown tool '$t' in TOOLS" ;; esac
done
for w in $waiters; do [[ "$w" =~ ^[1-9][0-9]*$ ]] || die "bad number of waiters '$w' in WAITERS"; done

# --- what it needs --------------------------------------------------------------------------------
source "$bench/lib.sh"
need redis-server redis-server
need redis-cli redis-tools
need etcd etcd-server
need etcdctl etcd-client
need gnuplot gnuplot-nox
need flock util-linux
need python3 python3
install_missing
export ETCDCTL_API=3
unset FENCERUN_REDIS_URL REDIS_URL REDISCLI_AUTH FENCERUN_REDIS_PASSWORD

# 1000 waiters, each with a connection or two, and a server that accepts them all.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true
(($(ulimit -n) >= 8192)) || say "warning: only $(ulimit -n) file descriptors; large cells may fail"

# --- servers --------------------------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/fencerun-waiters.XXXXXX")"
pidfile="$work/pids"   # every process waiters.py starts, for the clean-up
etcd_data=""
redis_pid="" etcd_pid="" py_pid="" etcd_data_note=""
cleanup() {
  set +e
  trap - INT TERM
  if [[ -n "$py_pid" ]] && kill -0 "$py_pid" 2>/dev/null; then
    kill "$py_pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$py_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$py_pid" 2>/dev/null
  fi
  # Whatever waiters.py left behind: only processes it started (their command line names $work).
  if [[ -s "$pidfile" ]]; then
    while read -r p; do
      [[ -r "/proc/$p/cmdline" ]] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF -- "$work" && kill -9 "$p" 2>/dev/null
      # redis-cli MONITOR does not name $work: it is a child of ours when its parent is gone too
      [[ -r "/proc/$p/cmdline" ]] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -q "^redis-cli -p $redis_port MONITOR" && kill -9 "$p" 2>/dev/null
    done <"$pidfile"
  fi
  for p in $redis_pid $etcd_pid; do
    kill "$p" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  rm -rf "$work"
  [[ -n "$etcd_data" ]] && rm -rf "$etcd_data"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

redis_port="$(free_port)"; taken+="$redis_port "
etcd_port="$(free_port)"; taken+="$etcd_port "
peer_port="$(free_port)"; taken+="$peer_port "
url="redis://127.0.0.1:$redis_port"
endpoint="http://127.0.0.1:$etcd_port"
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
date_start="$(date -u +%Y-%m-%dT%H:%MZ)"

if [[ " $tools " == *" fencerun"* ]]; then
  start_redis --maxclients "$maxclients"
  maxclients="$(redis-cli -p "$redis_port" CONFIG GET maxclients | tail -1)"  # less when file descriptors are short
  say "redis-server accepts $maxclients clients (open files limit $(ulimit -n))"
  "$fencerun" -r "$url" bench-check -- true || die "fencerun -- true failed"
  say "redis-server on $redis_port (pid $redis_pid)"
fi

if [[ " $tools " == *" etcd "* ]]; then
  start_etcd waiters
  etcdctl --endpoints="$endpoint" lock bench-check -- true || die "etcdctl lock -- true failed"
  say "etcd on $etcd_port (pid $etcd_pid), data on $etcd_data_note"
fi
flock "$work/flock-check" true || die "flock true failed"

# --- the sweep ------------------------------------------------------------------------------------
mkdir -p "$results"
csv() { tr -s ' \t\n' '\n' <<<"$1" | grep . | paste -sd, -; }
say "results in $results; waiters: $waiters; tools: $tools (load $load_start)"
python3 "$bench/waiters.py" sweep --fencerun "$fencerun" --redis-port "$redis_port" --redis-pid "${redis_pid:-0}" \
  --etcd-endpoint "$endpoint" --etcd-port "$etcd_port" --etcd-pid "${etcd_pid:-0}" \
  --work "$work" --pidfile "$pidfile" --wait "$wait_for" --results "$results" \
  --tools "$(csv "$tools")" --waiters "$(csv "$waiters")" &
py_pid=$!
wait "$py_pid" || die "waiters.py sweep failed (exit $?)"
py_pid=""

# --- report ---------------------------------------------------------------------------------------
python3 - "$results/meta.json" <<EOF
import json, sys
meta = {
  "command": """$command_line""",
  "date": """$date_start""",
  "date_end": """$(date -u +%Y-%m-%dT%H:%MZ)""",
  "nproc": """$(nproc)""",
  "cpu": """$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')""",
  "mem": """$(free -g | awk '/^Mem:/ { print $2 " GiB of memory" }')""",
  "kernel": """$(uname -r)""",
  "load_start": """$load_start""",
  "load_end": """$(cut -d' ' -f1-3 /proc/loadavg)""",
  "wait": """$wait_for""",
  "fencerun_version": """$("$fencerun" --version | head -1)""",
  "redis_version": """$(redis-server --version | cut -d' ' -f1-3)""",
  "etcd_version": """etcd $(etcd --version | head -1 | awk '{print $3}')""",
  "flock_version": """$(flock --version | head -1)""",
  "etcd_data": """${etcd_data_note:-n/a}""",
  "maxclients": "$maxclients",
  "open_files": "$(ulimit -n)",
  "binary": """${FENCERUN:-build/src/fencerun}""",
  "revision": """$(git -C "$repo" rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /' || echo 'an unknown revision')$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo ' with uncommitted changes' || true)""",
  "smoke": """${SMOKE:-}""",
  "seconds": $((SECONDS - started)),
}
json.dump(meta, open(sys.argv[1], "w"), indent=1)
EOF
mkdir -p "$(dirname "$doc")" "$(dirname "$plot")"
python3 "$bench/waiters.py" report --results "$results" --doc "$doc" --plot "$plot"
say "wrote $doc (section 7) and $plot in $((SECONDS - started)) s; results kept in $results"
