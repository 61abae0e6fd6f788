#!/usr/bin/env bash
# fencerun next to its alternatives, measured in one run on loopback:
#   1. overhead of one guarded run of `true`: fencerun, flock(1), `etcdctl lock`, a redis-cli script, bare true
#   2. Redis requests per run (MONITOR, Lua-internal commands left out), and the cost of waiting
#   3. hand-over latency with 1, 4 and 16 waiters (median, p99), fencerun with and without --fair,
#      etcdctl lock (watch-based) and the redis-cli script retrying every 100 ms
#   4. throughput: hand-overs per second with 16 contenders running `true` in a loop
#   5. stop latency: renewals blocked (redis-server stopped), when the command dies vs the lease deadline
#   6. peak RSS
# and writes docs/benchmarks.md and docs/handover.png. Not part of the test suite. Run it after building:
#   cmake -S . -B build -G Ninja && cmake --build build && bench/handover.sh
# Takes about 5 minutes. Installs what it needs (apt-get) when it is missing. Environment:
#   FENCERUN=path        binary to measure (default: build/src/fencerun in this checkout)
#   BENCH_DOC, BENCH_PLOT  where to write the report and the plot (default: docs/benchmarks.md, docs/handover.png)
#   SAMPLES=100          hand-overs per latency cell;  RUNS=30  hyperfine runs per command
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bench="$repo/bench"
fencerun="$(realpath "${FENCERUN:-$repo/build/src/fencerun}")"
doc="${BENCH_DOC:-$repo/docs/benchmarks.md}"
plot="${BENCH_PLOT:-$repo/docs/handover.png}"
samples="${SAMPLES:-100}"
runs="${RUNS:-30}"
command_line="bench/handover.sh"
for v in FENCERUN SAMPLES RUNS; do [[ -n "${!v:-}" ]] && command_line="$v=${!v} $command_line"; done
started=$SECONDS

say() { echo "handover.sh: $*" >&2; }
die() { say "$*"; exit 1; }
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"

# --- what it needs --------------------------------------------------------------------------------
source "$bench/lib.sh"
need redis-server redis-server
need redis-cli redis-tools
need etcd etcd-server
need etcdctl etcd-client
need hyperfine hyperfine
need gnuplot gnuplot-nox
need flock util-linux
need python3 python3
[[ -x /usr/bin/time ]] || missing+=(time)
install_missing
export ETCDCTL_API=3
unset FENCERUN_REDIS_URL REDIS_URL REDISCLI_AUTH FENCERUN_REDIS_PASSWORD

# --- servers --------------------------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/fencerun-handover.XXXXXX")"
etcd_data=""
redis_pid="" etcd_pid="" monitor_pid=""
bg_pids=()
cleanup() {
  set +e
  for p in "${bg_pids[@]}" $monitor_pid; do kill "$p" 2>/dev/null; done
  [[ -n "$redis_pid" ]] && kill -CONT "$redis_pid" 2>/dev/null
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

start_redis

start_etcd handover
say "redis-server on $redis_port (pid $redis_pid), etcd on $etcd_port (pid $etcd_pid), work dir $work"

cli() { redis-cli -p "$redis_port" "$@"; }
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
results="$work/results"
mkdir -p "$results"
py() { python3 "$bench/handover.py" "$@" --fencerun "$fencerun" --lock-script "$bench/redis-lock.sh" \
  --redis-port "$redis_port" --redis-pid "$redis_pid" --etcd-endpoint "$endpoint" --work "$work"; }

# Every tool must work once before anything is timed.
"$fencerun" -r "$url" bench-check -- true || die "fencerun -- true failed"
etcdctl --endpoints="$endpoint" lock bench-check -- true || die "etcdctl lock -- true failed"
sh "$bench/redis-lock.sh" "$redis_port" bench-check 30000 0 true || die "redis-lock.sh failed"

# --- 1. overhead ----------------------------------------------------------------------------------
say "1/6 overhead of one guarded run (hyperfine)"
hyperfine -N --warmup 5 --runs "$runs" --export-json "$work/hyperfine.json" \
  "true" \
  "flock $work/flock true" \
  "$fencerun -r $url bench-overhead -- true" \
  "etcdctl --endpoints=$endpoint lock bench-overhead -- true" \
  "sh $bench/redis-lock.sh $redis_port bench-overhead 30000 0 true" >"$work/hyperfine.out" 2>&1 ||
  die "hyperfine failed: $(tail -5 "$work/hyperfine.out")"
python3 - "$work/hyperfine.json" "$runs" >"$results/overhead.json" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
tools = ["true", "flock", "fencerun", "etcd", "poll"]
shown = ["true", "flock FILE true", "fencerun -r redis://127.0.0.1:PORT NAME -- true",
         "etcdctl --endpoints=http://127.0.0.1:PORT lock NAME -- true",
         "sh bench/redis-lock.sh PORT NAME 30000 0 true"]
out = {"runs": int(sys.argv[2]), "warmup": 5, "results": []}
for tool, cmd, r in zip(tools, shown, data["results"]):
    out["results"].append({"tool": tool, "command": cmd, "median_ms": r["median"] * 1e3,
                           "mean_ms": r["mean"] * 1e3, "stddev_ms": (r.get("stddev") or 0) * 1e3,
                           "cpu_ms": (r["user"] + r["system"]) * 1e3})
json.dump(out, sys.stdout, indent=1)
EOF

# --- 2. Redis requests ----------------------------------------------------------------------------
say "2/6 Redis requests per run (MONITOR)"
start_monitor() {
  redis-cli -p "$redis_port" MONITOR >"$1" &
  monitor_pid=$!
  for _ in $(seq 100); do [[ -s "$1" ]] && break; sleep 0.02; done  # "OK": MONITOR is attached
}
stop_monitor() {
  sleep 0.2
  kill "$monitor_pid" 2>/dev/null || true
  wait "$monitor_pid" 2>/dev/null || true
  monitor_pid=""
}
client_lines() { grep -E '^[0-9]+\.[0-9]+ \[[0-9]+ ' "$1" | grep -v ' lua\]' || true; }
count_requests() { client_lines "$1" | wc -l | tr -d ' '; }
command_names() { client_lines "$1" | sed -E 's/^[^"]*"([^"]*)".*/\1/' | tr '[:upper:]' '[:lower:]' | paste -sd' ' -; }
request_row() {  # label file
  printf '{"label": "%s", "count": %s, "commands": "%s"}' "$1" "$(count_requests "$2")" "$(command_names "$2")"
}
one_run() {  # file label command...
  local f="$1" label="$2"; shift 2
  start_monitor "$f"
  "$@" >/dev/null
  stop_monitor
  request_row "$label" "$f"
}
rows=()
"$fencerun" -r "$url" bench-req -- true  # scripts cached
rows+=("$(one_run "$work/mon-warm" '`fencerun NAME -- true`, scripts cached' "$fencerun" -r "$url" bench-req -- true)")
rows+=("$(one_run "$work/mon-fair" '`fencerun --fair NAME -- true`, scripts cached' "$fencerun" -r "$url" --fair bench-req -- true)")
cli SCRIPT FLUSH >/dev/null
rows+=("$(one_run "$work/mon-cold" '`fencerun NAME -- true` after SCRIPT FLUSH' "$fencerun" -r "$url" bench-req -- true)")
rows+=("$(one_run "$work/mon-sh" 'redis-cli script (`redis-lock.sh`)' sh "$bench/redis-lock.sh" "$redis_port" bench-req 30000 0 true)")

# etcd: gRPC calls started by one `etcdctl lock NAME -- true`, from etcd's Prometheus metrics.
grpc_started() {
  python3 - "$endpoint/metrics" <<'EOF'
import sys, urllib.request
for line in urllib.request.urlopen(sys.argv[1], timeout=5).read().decode().splitlines():
    if line.startswith("grpc_server_started_total{"):
        labels, value = line.rsplit(" ", 1)
        method = labels.split('grpc_method="', 1)[1].split('"', 1)[0]
        if float(value) > 0:
            print(method, int(float(value)))
EOF
}
grpc_started >"$work/grpc-before"
etcdctl --endpoints="$endpoint" lock bench-req -- true
sleep 0.3
grpc_started >"$work/grpc-after"
etcd_calls="$(awk 'NR == FNR { before[$1] = $2; next } { d = $2 - before[$1]; if (d > 0) { n += d; s = s (s ? " " : "") $1 (d > 1 ? "×" d : "") } }
  END { printf "{\"count\": %d, \"calls\": \"%s\"}", n, s }' "$work/grpc-before" "$work/grpc-after")"

# Cost of waiting: each kind of waiter waits on a held lock for 5 s; requests seen by MONITOR for
# that lock's keys, and CPU (utime+stime+cutime+cstime) from /proc/PID/stat.
say "   cost of waiting (5 s)"
hz="$(getconf CLK_TCK)"
cpu_ticks() { awk '{ sub(/.*\) /, ""); print $12 + $13 + $14 + $15 }' "/proc/$1/stat"; }
start_monitor "$work/mon-wait"
"$fencerun" -r "$url" bench-wait-plain -- sleep 8 & bg_pids+=($!)
"$fencerun" -r "$url" --fair bench-wait-fair -- sleep 8 & bg_pids+=($!)
sh "$bench/redis-lock.sh" "$redis_port" bench-wait-poll 30000 0 sleep 8 & bg_pids+=($!)
etcdctl --endpoints="$endpoint" lock bench-wait-etcd -- sleep 8 >/dev/null & bg_pids+=($!)
sleep 0.5
"$fencerun" -r "$url" --wait inf bench-wait-plain -- true & w_plain=$!
"$fencerun" -r "$url" --wait inf --fair bench-wait-fair -- true & w_fair=$!
sh "$bench/redis-lock.sh" "$redis_port" bench-wait-poll 30000 1 true & w_poll=$!
etcdctl --endpoints="$endpoint" lock bench-wait-etcd -- true >/dev/null & w_etcd=$!
bg_pids+=("$w_plain" "$w_fair" "$w_poll" "$w_etcd")
sleep 1
declare -A cpu0
for w in $w_plain $w_fair $w_poll $w_etcd; do cpu0[$w]="$(cpu_ticks "$w")"; done
t1="$(date +%s.%N)"
sleep 5
t2="$(date +%s.%N)"
waiting_rows=()
for entry in "plain:$w_plain:\`fencerun --wait inf\`" "fair:$w_fair:\`fencerun --wait inf --fair\`" \
  "poll:$w_poll:redis-cli script (100 ms polling)" "etcd:$w_etcd:\`etcdctl lock\`"; do
  IFS=: read -r tag pid label <<<"$entry"
  ticks=$(($(cpu_ticks "$pid") - ${cpu0[$pid]}))
  waiting_rows+=("$tag $pid $ticks $label")
done
wait "${bg_pids[@]}" 2>/dev/null || true
bg_pids=()
stop_monitor
waiting_json="$(for r in "${waiting_rows[@]}"; do
  read -r tag pid ticks label <<<"$r"
  if [[ $tag == etcd ]]; then n=null; else
    n="$(client_lines "$work/mon-wait" | awk -v a="$t1" -v b="$t2" -v k="{bench-wait-$tag}" '$1 >= a && $1 < b && index($0, k)' | wc -l)"
  fi
  printf '{"label": "%s", "requests": %s, "cpu_ms": %d}\n' "$label" "$n" $((ticks * 1000 / hz))
done | paste -sd, -)"
{
  echo '{"runs": ['
  (IFS=,; echo "${rows[*]}")
  echo "], \"etcd\": $etcd_calls, \"waiting\": {\"seconds\": 5, \"rows\": [$waiting_json]}}"
} >"$results/requests.json"
python3 -m json.tool "$results/requests.json" >/dev/null || die "bad requests.json: $(cat "$results/requests.json")"

# --- 3. hand-over latency -------------------------------------------------------------------------
say "3/6 hand-over latency ($samples hand-overs per cell)"
py latency --tools fencerun,fencerun-fair,etcd,poll --waiters 1,4,16 --samples "$samples" --hold-ms 50 \
  >"$results/latency.json"

# --- 4. throughput --------------------------------------------------------------------------------
say "4/6 throughput with 16 contenders"
py throughput --tools fencerun,fencerun-fair,etcd,poll,flock --contenders 16 --seconds 5 >"$results/throughput.json"

# --- 5. stop latency ------------------------------------------------------------------------------
say "5/6 stop latency with renewals blocked"
py stop --repeats 5 --ttl-ms 2000 >"$results/stop.json"
cli PING >/dev/null || die "redis-server did not come back after SIGCONT"

# --- 6. memory ------------------------------------------------------------------------------------
say "6/6 peak RSS"
py rss --tools fencerun,etcd,poll,flock --repeats 5 >"$results/rss.json"

# --- report ---------------------------------------------------------------------------------------
python3 - "$results/meta.json" <<EOF
import json, sys
meta = {
  "command": """$command_line""",
  "date": """$(date -u +%Y-%m-%dT%H:%MZ)""",
  "nproc": """$(nproc)""",
  "cpu": """$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')""",
  "kernel": """$(uname -r)""",
  "load_start": """$load_start""",
  "load_end": """$(cut -d' ' -f1-3 /proc/loadavg)""",
  "fencerun_version": """$("$fencerun" --version | head -1)""",
  "redis_version": """$(redis-server --version | cut -d' ' -f1-3)""",
  "etcd_version": """etcd $(etcd --version | head -1 | awk '{print $3}')""",
  "hyperfine_version": """$(hyperfine --version)""",
  "etcd_data": """$etcd_data_note""",
  "binary": """${FENCERUN:-build/src/fencerun}""",
  "revision": """$(git -C "$repo" rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /' || echo 'an unknown revision')$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo ' with uncommitted changes' || true)""",
  "seconds": $((SECONDS - started)),
}
json.dump(meta, open(sys.argv[1], "w"), indent=1)
EOF
mkdir -p "$(dirname "$doc")" "$(dirname "$plot")"
python3 "$bench/handover.py" report --results "$results" --doc "$doc" --plot "$plot"
if [[ -n "${BENCH_KEEP_RESULTS:-}" ]]; then mkdir -p "$BENCH_KEEP_RESULTS" && cp -r "$results"/. "$BENCH_KEEP_RESULTS"/; fi
say "wrote $doc and $plot in $((SECONDS - started)) s"
