#!/usr/bin/env bash
# What the record of runs and --min-interval cost per run, next to a run without them, in one hyperfine
# run on loopback (fencerun NAME -- true):
#   without a record      BASELINE (a fencerun from before the record of runs: required)
#   with the record       this fencerun, no --min-interval (the record is always kept)
#   --min-interval 1ms    the check made too (every run passes it)
#   skipped               --min-interval 1h after a success: the command is not started
# for one server, a counting lock (--limit 3), a quorum of 3 and a one-member etcd (its data on tmpfs
# when there is one), against redis-servers without persistence, with `hyperfine -N -w WARMUP -r
# RUNS`, plus the requests each run makes (Redis: INFO commandstats on every server, the calls scripts
# make inside the server included; etcd: its grpc_server_handled_total, before and after RUNS more
# runs). The load average is recorded before and after;
# nothing is measured while it is at or above the number of CPUs (waits up to LOAD_WAIT seconds).
# Writes the section between <!-- records:begin --> and <!-- records:end --> of docs/benchmarks.md
# (appended at the end the first time).
#
#   BASELINE=path/to/older/fencerun bench/records.sh
#
# Environment: FENCERUN=path (default build/src/fencerun), BASELINE=path (required), BENCH_DOC=path
# (default docs/benchmarks.md; - prints only), RUNS=100 WARMUP=10 LOAD_WAIT=600, LOAD_MAX=N.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fencerun="$(realpath "${FENCERUN:-$repo/build/src/fencerun}")"
doc="${BENCH_DOC:-$repo/docs/benchmarks.md}"
runs="${RUNS:-100}"
warmup="${WARMUP:-10}"
load_wait="${LOAD_WAIT:-600}"

say() { echo "records.sh: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"
[[ -n "${BASELINE:-}" && -x "$BASELINE" ]] || die "set BASELINE to a fencerun from before the record of runs"
baseline="$(realpath "$BASELINE")"
need redis-server redis-server
need redis-cli redis-tools
need hyperfine hyperfine
need etcd etcd-server
need etcdctl etcd-client
need curl curl
install_missing

work="$(mktemp -d "${TMPDIR:-/tmp}/fencerun-records.XXXXXX")"
ports=()
etcd_pid="" etcd_data=""
cleanup() {
  for p in "${ports[@]}"; do redis-cli -p "$p" SHUTDOWN NOSAVE >/dev/null 2>&1 || true; done
  [[ -n "$etcd_pid" ]] && kill "$etcd_pid" 2>/dev/null && wait "$etcd_pid" 2>/dev/null
  [[ -n "$etcd_data" && "$etcd_data" == /dev/shm/* ]] && rm -rf "$etcd_data"
  rm -rf "$work"
}
trap cleanup EXIT
for i in 1 2 3; do
  p="$(free_port)"
  redis-server --bind 127.0.0.1 --port "$p" --daemonize yes --dir "$work" --logfile "$work/redis-$i.log" \
    --pidfile "$work/redis-$i.pid" --save '' --appendonly no >/dev/null
  ports+=("$p")
done
for p in "${ports[@]}"; do
  for _ in $(seq 100); do redis-cli -p "$p" PING 2>/dev/null | grep -q PONG && break; sleep 0.05; done
  redis-cli -p "$p" PING | grep -q PONG || die "redis-server on $p did not start"
done

etcd_port="$(free_port)"
peer_port="$(free_port)"
endpoint="http://127.0.0.1:$etcd_port"
start_etcd records

r() { local a=""; for p in "$@"; do a+=" -r redis://127.0.0.1:$p"; done; echo "$a"; }
e=" -r etcd://127.0.0.1:$etcd_port --ttl 10s"
one="$(r "${ports[0]}")"
three="$(r "${ports[@]}")"
# name|command|ports
rows=(
  "one server, without a record (baseline)|$baseline$one b1 -- true|${ports[0]}"
  "one server, with the record|$fencerun$one r1 -- true|${ports[0]}"
  "one server, --min-interval 1ms|$fencerun$one --min-interval 1ms m1 -- true|${ports[0]}"
  "one server, skipped (--min-interval 1h)|$fencerun$one --min-interval 1h s1 -- true|${ports[0]}"
  "counting lock (--limit 3), without a record (baseline)|$baseline$one --limit 3 bl -- true|${ports[0]}"
  "counting lock (--limit 3), with the record|$fencerun$one --limit 3 rl -- true|${ports[0]}"
  "counting lock (--limit 3), --min-interval 1ms|$fencerun$one --limit 3 --min-interval 1ms ml -- true|${ports[0]}"
  "quorum of 3, without a record (baseline)|$baseline$three b3 -- true|${ports[*]}"
  "quorum of 3, with the record|$fencerun$three r3 -- true|${ports[*]}"
  "quorum of 3, --min-interval 1ms|$fencerun$three --min-interval 1ms m3 -- true|${ports[*]}"
  "quorum of 3, skipped (--min-interval 1h)|$fencerun$three --min-interval 1h s3 -- true|${ports[*]}"
  "etcd, without a record (baseline)|$baseline$e be -- true|etcd"
  "etcd, with the record|$fencerun$e re -- true|etcd"
  "etcd, --min-interval 1ms|$fencerun$e --min-interval 1ms me -- true|etcd"
  "etcd, skipped (--min-interval 1h)|$fencerun$e --min-interval 1h se -- true|etcd"
)
args=()
for row in "${rows[@]}"; do
  IFS='|' read -r name cmd _ <<<"$row"
  # The first run of each succeeds (and gives the skipped rows their success to skip after).
  # shellcheck disable=SC2086
  $cmd || die "\`$cmd\` failed"
  args+=(-n "$name" "$cmd")
done

wait_for_quiet "$load_wait"
hyperfine -N -w "$warmup" -r "$runs" --style basic --export-json "$work/h.json" "${args[@]}" >/dev/null

total_calls() {
  local sum=0 p
  if [[ "$1" == etcd ]]; then  # every gRPC call the member handled (the JSON gateway's included)
    curl -s "$endpoint/metrics" | awk '/^grpc_server_handled_total/ {s += $2} END {printf "%d\n", s}'
    return
  fi
  for p in "$@"; do
    sum=$((sum + $(redis-cli -p "$p" INFO commandstats | sed -n 's/^cmdstat_[^:]*:calls=\([0-9]*\),.*/\1/p' |
      awk '{s+=$1} END {print s+0}')))
  done
  echo "$sum"
}
calls=()
for row in "${rows[@]}"; do
  IFS='|' read -r _ cmd rports <<<"$row"
  read -ra ps <<<"$rports"
  before="$(total_calls "${ps[@]}")"
  # shellcheck disable=SC2086
  for _ in $(seq "$runs"); do $cmd >/dev/null 2>&1 || true; done
  after="$(total_calls "${ps[@]}")"
  # Each INFO is counted once it answered: the first counting pass falls in the window (one per server).
  skew=$((${#ps[@]} - 1))
  [[ "$rports" == etcd ]] && skew=0
  calls+=("$(awk -v a="$after" -v b="$before" -v r="$runs" -v s="$skew" 'BEGIN {printf "%.1f", (a - b - s) / r}')")
done
load_after="$(uptime)"

section="$(bench_python - "$work/h.json" "$load_before" "$load_after" "$runs" "$warmup" "$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)" "${calls[@]}" <<'PY'
import sys
from lib import hyperfine_results, hyperfine_rows
h, before, after, runs, warmup, head, *calls = sys.argv[1:]
res = hyperfine_results(h)
out = ["<!-- records:begin -->", "## 12. The record of runs and `--min-interval`: cost per run", "",
       "`bench/records.sh`: `fencerun ... NAME -- true` on loopback against redis-servers without",
       "persistence and a one-member etcd (`--ttl 10s`, data on tmpfs), next to a fencerun from before",
       f"the record of runs (BASELINE), all rows in one `hyperfine -N -w {warmup} -r {runs}` run; requests",
       "per run: Redis commands summed over the servers (INFO commandstats: the calls scripts make inside",
       "the server included), etcd gRPC calls handled (`grpc_server_handled_total`: the JSON gateway's",
       "requests, each an internal gRPC call; a stream, as LeaseKeepAlive's, counts once it closes).",
       f"fencerun at {head}.", "",
       f"Load before: `{before}`  ", f"Load after: `{after}`", "",
       "| run | mean | ± σ | median | requests per run |", "|---|---|---|---|---|"]
out += hyperfine_rows(res, calls)
out += ["", "<!-- records:end -->"]
print("\n".join(out))
PY
)"
splice_section "$doc" records "$section"
[[ "$doc" == "-" ]] || say "wrote the records section of $doc"
