#!/usr/bin/env bash
# What the backends' seam costs a run: this build's fencerun next to BASELINE's (another build, e.g. the
# commit before the backends became modules), side by side in one hyperfine run per backend, on one
# Redis server, a quorum of 3 Redis servers and a 1-member etcd, back to back and spaced by 100 ms (as
# cron runs come). flock(1) runs alongside as the reference. Nothing is measured while the load average
# is at or above the number of CPUs (waits up to LOAD_WAIT seconds). Writes the section between
# <!-- seam:begin --> and <!-- seam:end --> of docs/benchmarks.md (appended the first time).
#
#   BASELINE=/path/to/old/fencerun bench/seam.sh
#
# Environment: FENCERUN=path (default build/src/fencerun), BASELINE=path (required), BENCH_DOC=path (-
# prints only), RUNS=100 WARMUP=10 LOAD_WAIT=600, LOAD_MAX=N (default the number of CPUs).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fencerun="$(realpath "${FENCERUN:-$repo/build/src/fencerun}")"
baseline="$(realpath "${BASELINE:?set BASELINE to the fencerun to compare with}")"
doc="${BENCH_DOC:-$repo/docs/benchmarks.md}"
runs="${RUNS:-100}"
warmup="${WARMUP:-10}"
load_wait="${LOAD_WAIT:-600}"

say() { echo "seam.sh: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"
[[ -x "$baseline" ]] || die "no fencerun binary at $baseline (BASELINE)"
need redis-server redis-server
need redis-cli redis-tools
need etcd etcd-server
need etcdctl etcd-client
need hyperfine hyperfine
need flock util-linux
install_missing
export ETCDCTL_API=3
unset FENCERUN_SERVER FENCERUN_REDIS_URL REDIS_URL REDISCLI_AUTH FENCERUN_REDIS_PASSWORD

work="$(mktemp -d "${TMPDIR:-/tmp}/fencerun-seam-bench.XXXXXX")"
quorum_ports=() redis_pids=()
etcd_pid="" etcd_data=""
cleanup() {
  set +e
  for p in "${redis_pids[@]}"; do kill "$p" 2>/dev/null; done
  [[ -n "$etcd_pid" ]] && kill "$etcd_pid" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work" "$etcd_data"
}
trap cleanup EXIT

# One Redis for the single-server rows, three more for the quorum.
for i in 0 1 2 3; do
  redis_port="$(free_port)"
  mkdir -p "$work/r$i"
  redis-server --bind 127.0.0.1 --port "$redis_port" --daemonize yes --pidfile "$work/r$i/redis.pid" \
    --dir "$work/r$i" --logfile "$work/r$i/redis.log" --save '' --appendonly no >/dev/null
  for _ in $(seq 100); do
    [[ -s "$work/r$i/redis.pid" ]] && redis-cli -p "$redis_port" PING 2>/dev/null | grep -q PONG && break
    sleep 0.05
  done
  redis_pids+=("$(cat "$work/r$i/redis.pid")")
  if ((i == 0)); then single="redis://127.0.0.1:$redis_port"; else quorum_ports+=("$redis_port"); fi
done
quorum=""
for p in "${quorum_ports[@]}"; do quorum+=" -r redis://127.0.0.1:$p"; done
endpoint="http://127.0.0.1:$(free_port)"
peer_port="$(free_port)"
start_etcd seam

declare -A targets=([redis]="-r $single" [quorum]="$quorum" [etcd]="-r etcd://${endpoint#http://}")
for b in redis quorum etcd; do
  for bin in "$fencerun" "$baseline"; do
    # shellcheck disable=SC2086
    "$bin" ${targets[$b]} seam-check -- true || die "$bin on $b failed"
  done
done

wait_for_quiet "$load_wait"

for b in redis quorum etcd; do
  names=(-n "flock(1)" "flock $work/flock true"
    -n "fencerun ($b), this build" "$fencerun ${targets[$b]} seam-new -- true"
    -n "fencerun ($b), baseline" "$baseline ${targets[$b]} seam-old -- true")
  hyperfine -N -w "$warmup" -r "$runs" --style basic --export-json "$work/$b-back.json" "${names[@]}" >/dev/null
  hyperfine -N -w "$warmup" -r "$runs" --prepare 'sleep 0.1' --style basic --export-json "$work/$b-spaced.json" \
    "${names[@]}" >/dev/null
done
load_after="$(uptime)"

section="$(bench_python - "$work" "$load_before" "$load_after" "$runs" "$warmup" "$etcd_data_note" <<'PY'
import sys
from lib import hyperfine_results, hyperfine_rows
work, before, after, runs, warmup, note = sys.argv[1:]
out = ["<!-- seam:begin -->", "## 13. The backends' seam: cost per run before and after", "",
       "`bench/seam.sh`: `NAME -- true` under this build's fencerun and the baseline's (the build before the",
       "backends became modules behind `src/lease/`), side by side with flock(1) in one hyperfine run per",
       f"backend, `hyperfine -N -w {warmup} -r {runs}`, back to back and with `--prepare 'sleep 0.1'`. One Redis",
       f"server, a quorum of 3 Redis servers, a 1-member etcd (its data on {note}).", "",
       f"Load before: `{before}`  ", f"Load after: `{after}`", ""]
for b in ("redis", "quorum", "etcd"):
    for label, f in (("back to back", "back"), ("spaced by 100 ms", "spaced")):
        res = hyperfine_results(f"{work}/{b}-{f}.json")
        old = next(r for r in res if r["command"].endswith("baseline"))["median"]
        out += [f"{b}, {label}:", "", "| command | mean | ± σ | median | vs baseline (median) |",
                "|---|---|---|---|---|"]
        out += hyperfine_rows(res, lambda r: f"{r['median']/old:.2f}x")
        out.append("")
out.append("<!-- seam:end -->")
print("\n".join(out))
PY
)"
splice_section "$doc" seam "$section"
[[ "$doc" == "-" ]] || say "wrote the seam section of $doc"
