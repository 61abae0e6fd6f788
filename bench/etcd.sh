#!/usr/bin/env bash
# fencerun on etcd next to fencerun on Redis, `etcdctl lock` and flock(1), in one run on loopback:
#   1. cost of one guarded run of `true` (hyperfine -N, all commands in one hyperfine run; back to back,
#      then spaced by 100 ms, as cron runs are): flock, fencerun -r redis://, fencerun on a quorum of 3
#      Redis servers, fencerun -r etcd:// (a 3-member cluster), etcdctl lock on the same cluster, and
#      BASELINE's fencerun -r etcd:// when given; and the requests per run each makes of the cluster,
#      counted by the members themselves (grpc_server_handled_total on their /metrics)
#   2. hand-over latency with 1 and 4 waiters (bench/handover.py latency): fencerun on Redis, fencerun
#      on etcd, etcdctl lock
# The etcd members keep their data on tmpfs when /dev/shm is writable (fsync then costs little there,
# as the Redis server here persists nothing); the report says where. Nothing is measured while the load
# average is at or above the number of CPUs (waits up to LOAD_WAIT seconds). Writes the section between
# <!-- etcd:begin --> and <!-- etcd:end --> of docs/benchmarks.md (appended the first time).
#
#   cmake -S . -B build -G Ninja && cmake --build build && bench/etcd.sh
#
# Environment: FENCERUN=path (default build/src/fencerun), BASELINE=path (another fencerun, e.g. an
# earlier commit's), BENCH_DOC=path (- prints only), RUNS=100 WARMUP=10 SAMPLES=50 LOAD_WAIT=600,
# LOAD_MAX=N (measure only below this load average; default the number of CPUs).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fencerun="$(realpath "${FENCERUN:-$repo/build/src/fencerun}")"
baseline="${BASELINE:+$(realpath "$BASELINE")}"
doc="${BENCH_DOC:-$repo/docs/benchmarks.md}"
runs="${RUNS:-100}"
warmup="${WARMUP:-10}"
samples="${SAMPLES:-50}"
load_wait="${LOAD_WAIT:-600}"

say() { echo "etcd.sh: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"
need redis-server redis-server
need redis-cli redis-tools
need etcd etcd-server
need etcdctl etcd-client
need hyperfine hyperfine
need flock util-linux
install_missing
export ETCDCTL_API=3
unset FENCERUN_REDIS_URL REDIS_URL REDISCLI_AUTH FENCERUN_REDIS_PASSWORD

work="$(mktemp -d "${TMPDIR:-/tmp}/fencerun-etcd-bench.XXXXXX")"
if [[ -d /dev/shm && -w /dev/shm ]]; then
  data="$(mktemp -d /dev/shm/fencerun-etcd-bench.XXXXXX)"
  data_note="tmpfs (/dev/shm): fsync costs little there, as the Redis server here persists nothing"
else
  data="$work/data"
  data_note="disk: etcd pays for fsync, the Redis server here does not"
fi
pids=()
redis_port="$(free_port)"
quorum_ports=("$(free_port)" "$(free_port)" "$(free_port)")
export XDG_CACHE_HOME="$work/cache"  # fencerun's cache of the cluster's version: this run's own
cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "$redis_port" "${quorum_ports[@]}"; do redis-cli -p "$p" SHUTDOWN NOSAVE >/dev/null 2>&1; done
  wait 2>/dev/null
  rm -rf "$work" "$data"
}
trap cleanup EXIT

for p in "$redis_port" "${quorum_ports[@]}"; do
  redis-server --bind 127.0.0.1 --port "$p" --daemonize yes --dir "$work" --logfile "$work/redis-$p.log" \
    --save '' --appendonly no --dbfilename "dump-$p.rdb" >/dev/null
done
clients=() peers=() initial=""
for i in 0 1 2; do
  clients+=("$(free_port)")
  peers+=("$(free_port)")
  initial+="${initial:+,}e$i=http://127.0.0.1:${peers[$i]}"
done
for i in 0 1 2; do
  etcd --name "e$i" --data-dir "$data/e$i" \
    --listen-client-urls "http://127.0.0.1:${clients[$i]}" --advertise-client-urls "http://127.0.0.1:${clients[$i]}" \
    --listen-peer-urls "http://127.0.0.1:${peers[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${peers[$i]}" \
    --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token "bench-$$" \
    >"$work/etcd-$i.log" 2>&1 &
  pids+=($!)
done
endpoints="127.0.0.1:${clients[0]},127.0.0.1:${clients[1]},127.0.0.1:${clients[2]}"
for _ in $(seq 100); do etcdctl --endpoints="$endpoints" endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
etcdctl --endpoints="$endpoints" endpoint health >/dev/null 2>&1 || die "etcd did not become healthy"
for p in "$redis_port" "${quorum_ports[@]}"; do
  for _ in $(seq 100); do redis-cli -p "$p" PING 2>/dev/null | grep -q PONG && break; sleep 0.05; done
done

flock_cmd="flock $work/flock true"
redis_cmd="$fencerun -r redis://127.0.0.1:$redis_port bench-r -- true"
quorum_cmd="$fencerun -r redis://127.0.0.1:${quorum_ports[0]} -r redis://127.0.0.1:${quorum_ports[1]} -r redis://127.0.0.1:${quorum_ports[2]} bench-q -- true"
etcd_cmd="$fencerun -r etcd://$endpoints bench-e -- true"
etcdctl_cmd="etcdctl --endpoints=$endpoints lock bench-c true"
names=(-n "flock(1)" "$flock_cmd" -n "fencerun -r redis://" "$redis_cmd" -n "fencerun, quorum of 3" "$quorum_cmd"
  -n "fencerun -r etcd:// (3 members)" "$etcd_cmd" -n "etcdctl lock (3 members)" "$etcdctl_cmd")
baseline_cmd=""
if [[ -n "$baseline" ]]; then
  baseline_cmd="$baseline -r etcd://$endpoints bench-b -- true"
  names+=(-n "fencerun -r etcd:// (baseline)" "$baseline_cmd")
fi
for c in "$redis_cmd" "$quorum_cmd" "$etcd_cmd" "$etcdctl_cmd" ${baseline_cmd:+"$baseline_cmd"}; do
  # shellcheck disable=SC2086
  $c >/dev/null 2>&1 || die "\`$c\` failed"
done

# Requests the members handled (every grpc_server_handled_total counter of the three, summed).
handled() {
  local sum=0 p n
  for p in "${clients[@]}"; do
    n="$(python3 -c 'import sys, urllib.request
t = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print(sum(int(float(l.rsplit(" ", 1)[1])) for l in t.splitlines() if l.startswith("grpc_server_handled_total{")))' "$p")"
    sum=$((sum + n))
  done
  echo "$sum"
}
# requests_per_run CMD: the members' count over 50 runs of CMD, per run.
requests_per_run() {
  local before after
  before="$(handled)"
  for _ in $(seq 50); do
    # shellcheck disable=SC2086
    $1 >/dev/null 2>&1
  done
  after="$(handled)"
  python3 -c "print(f'{($after - $before) / 50:.2f}')"
}
req_etcd="$(requests_per_run "$etcd_cmd")"
req_etcdctl="$(requests_per_run "$etcdctl_cmd")"
req_baseline=""
[[ -n "$baseline_cmd" ]] && req_baseline="$(requests_per_run "$baseline_cmd")"

wait_for_quiet "$load_wait"

hyperfine -N -w "$warmup" -r "$runs" --style basic --export-json "$work/back.json" "${names[@]}" >/dev/null
hyperfine -N -w "$warmup" -r "$runs" --prepare 'sleep 0.1' --style basic --export-json "$work/spaced.json" \
  "${names[@]}" >/dev/null
python3 "$repo/bench/handover.py" latency --fencerun "$fencerun" --redis-port "$redis_port" \
  --etcd-endpoint "$endpoints" --work "$work" --tools fencerun,fencerun-etcd,etcd --waiters 1,4 \
  --samples "$samples" --hold-ms 50 >"$work/latency.json"
load_after="$(uptime)"

section="$(bench_python - "$work" "$load_before" "$load_after" "$runs" "$warmup" "$samples" "$data_note" \
  "$req_etcd" "$req_etcdctl" "$req_baseline" <<'PY'
import json, sys
from lib import hyperfine_results, hyperfine_rows
work, before, after, runs, warmup, samples, note, req_etcd, req_etcdctl, req_baseline = sys.argv[1:]
out = ["<!-- etcd:begin -->", "## 11. etcd: cost per run and hand-over", "",
       "`bench/etcd.sh`: `NAME -- true` under flock(1), fencerun on one Redis server, fencerun on a quorum of",
       "3 Redis servers, fencerun on a 3-member",
       f"etcd cluster and `etcdctl lock` on the same cluster, `hyperfine -N -w {warmup} -r {runs}` (all in one",
       "hyperfine run; back to back, then with `--prepare 'sleep 0.1'`, as cron runs come); hand-over",
       f"latency with `bench/handover.py latency` ({samples} hand-overs per cell, 50 ms holds). etcd's data: {note}.", "",
       f"Load before: `{before}`  ", f"Load after: `{after}`", ""]
for label, f in (("back to back", "back.json"), ("spaced by 100 ms", "spaced.json")):
    res = hyperfine_results(f"{work}/{f}")
    median = {r["command"]: r["median"] for r in res}
    flock, redis, etcdctl = median["flock(1)"], median["fencerun -r redis://"], median["etcdctl lock (3 members)"]
    out += [f"Per run, {label}:", "",
            "| command | mean | ± σ | median | vs flock | vs one Redis | vs etcdctl lock |", "|---|---|---|---|---|---|---|"]
    out += hyperfine_rows(res, lambda r: f"{r['median']/flock:.2f}x", lambda r: f"{r['median']/redis:.2f}x",
                          lambda r: f"{r['median']/etcdctl:.2f}x")
    out.append("")
out += ["Requests per uncontended run, as the members counted them (`grpc_server_handled_total` of all three",
        "on their `/metrics`, over 50 runs):", "", "| command | requests per run |", "|---|---|",
        f"| fencerun -r etcd:// | {req_etcd} |", f"| etcdctl lock | {req_etcdctl} |"]
if req_baseline:
    out.append(f"| fencerun -r etcd:// (baseline) | {req_baseline} |")
out.append("")
lat = json.load(open(f"{work}/latency.json"))
labels = {"fencerun": "fencerun on Redis", "fencerun-etcd": "fencerun on etcd", "etcd": "etcdctl lock"}
out += ["Hand-over (the next holder's first act minus the last holder's last act):", "",
        "| tool | waiters | median | p99 | overlaps |", "|---|---|---|---|---|"]
for r in lat:
    out.append(f"| {labels.get(r['tool'], r['tool'])} | {r['waiters']} | {r.get('median_ms')} ms | {r.get('p99_ms')} ms | "
               f"{r['overlaps']} |")
out += ["", "<!-- etcd:end -->"]
print("\n".join(out))
PY
)"
splice_section "$doc" etcd "$section"
[[ "$doc" == "-" ]] || say "wrote the etcd section of $doc"
