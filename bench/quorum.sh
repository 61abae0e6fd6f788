#!/usr/bin/env bash
# What quorum mode costs per run next to single-server mode, in one hyperfine run on loopback:
#   fencerun -r A NAME -- true                      (single server)
#   fencerun -r A -r B -r C NAME -- true            (quorum of 3)
#   fencerun -r A -r B -r C -r D -r E NAME -- true  (quorum of 5)
# all against independent redis-servers without persistence, with `hyperfine -N -w WARMUP -r RUNS`,
# plus the Redis commands each run sends (INFO commandstats on every server, before and after RUNS
# more runs). The load average is recorded before and after; nothing is measured while it is at or
# above the number of CPUs (it waits up to LOAD_WAIT seconds for it to settle).
# Writes the section between <!-- quorum:begin --> and <!-- quorum:end --> of docs/benchmarks.md
# (appended at the end the first time).
#
#   cmake -S . -B build -G Ninja && cmake --build build && bench/quorum.sh
#
# Environment: FENCERUN=path (default build/src/fencerun), BENCH_DOC=path (default docs/benchmarks.md;
# - prints only), RUNS=100 WARMUP=10 LOAD_WAIT=600, LOAD_MAX=N (measure only below this load average;
# default the number of CPUs), BASELINE=path (another fencerun, e.g. an earlier commit's: its quorum
# of 3 and of 5 are measured in the same hyperfine run, as two more rows)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fencerun="$(realpath "${FENCERUN:-$repo/build/src/fencerun}")"
doc="${BENCH_DOC:-$repo/docs/benchmarks.md}"
runs="${RUNS:-100}"
warmup="${WARMUP:-10}"
load_wait="${LOAD_WAIT:-600}"
baseline="${BASELINE:+$(realpath "$BASELINE")}"

say() { echo "quorum.sh: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"
need redis-server redis-server
need redis-cli redis-tools
need hyperfine hyperfine
install_missing

work="$(mktemp -d "${TMPDIR:-/tmp}/fencerun-quorum.XXXXXX")"
ports=()
cleanup() {
  for p in "${ports[@]}"; do redis-cli -p "$p" SHUTDOWN NOSAVE >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

for i in 1 2 3 4 5; do
  p="$(free_port)"
  redis-server --bind 127.0.0.1 --port "$p" --daemonize yes --dir "$work" --logfile "$work/redis-$i.log" \
    --pidfile "$work/redis-$i.pid" --save '' --appendonly no >/dev/null
  ports+=("$p")
done
for p in "${ports[@]}"; do
  for _ in $(seq 100); do redis-cli -p "$p" PING 2>/dev/null | grep -q PONG && break; sleep 0.05; done
  redis-cli -p "$p" PING | grep -q PONG || die "redis-server on $p did not start"
done

r() { local a=""; for p in "$@"; do a+=" -r redis://127.0.0.1:$p"; done; echo "$a"; }
single="$fencerun$(r "${ports[0]}") bench-q1 -- true"
three="$fencerun$(r "${ports[@]:0:3}") bench-q3 -- true"
five="$fencerun$(r "${ports[@]}") bench-q5 -- true"
extra=()
if [[ -n "$baseline" ]]; then
  [[ -x "$baseline" ]] || die "no fencerun binary at $baseline (BASELINE)"
  three_b="$baseline$(r "${ports[@]:0:3}") bench-b3 -- true"
  five_b="$baseline$(r "${ports[@]}") bench-b5 -- true"
  extra=(-n "quorum of 3 (baseline)" "$three_b" -n "quorum of 5 (baseline)" "$five_b")
fi
for c in "$single" "$three" "$five" ${baseline:+"$three_b" "$five_b"}; do
  # shellcheck disable=SC2086
  $c || die "\`$c\` failed"
done

wait_for_quiet "$load_wait"

hyperfine -N -w "$warmup" -r "$runs" --style basic --export-json "$work/h.json" \
  -n "single server (-r A)" "$single" -n "quorum of 3" "$three" -n "quorum of 5" "$five" "${extra[@]}" >/dev/null

# Commands per run: every server's commandstats total, before and after RUNS runs of each mode.
total_calls() {
  local sum=0 p
  for p in "$@"; do
    sum=$((sum + $(redis-cli -p "$p" INFO commandstats | sed -n 's/^cmdstat_[^:]*:calls=\([0-9]*\),.*/\1/p' |
      awk '{s+=$1} END {print s+0}')))
  done
  echo "$sum"
}
per_run() {  # per_run "COMMAND" PORT...: Redis commands per run of COMMAND, the counting INFOs left out
  local cmd="$1" before after n=$#; shift
  before="$(total_calls "$@")"
  # shellcheck disable=SC2086
  for _ in $(seq "$runs"); do $cmd; done
  after="$(total_calls "$@")"
  # Each INFO is counted once it answered: the first counting pass falls in the window (one per server).
  awk -v a="$after" -v b="$before" -v r="$runs" -v s="$((n - 1))" 'BEGIN {printf "%.1f", (a - b - s) / r}'
}
c1="$(per_run "$single" "${ports[0]}")"
c3="$(per_run "$three" "${ports[@]:0:3}")"
c5="$(per_run "$five" "${ports[@]}")"
c3b="" c5b=""
if [[ -n "$baseline" ]]; then
  c3b="$(per_run "$three_b" "${ports[@]:0:3}")"
  c5b="$(per_run "$five_b" "${ports[@]}")"
fi
load_after="$(uptime)"

section="$(bench_python - "$work/h.json" "$c1" "$c3" "$c5" "$load_before" "$load_after" "$runs" "$warmup" "$c3b" "$c5b" <<'PY'
import sys
from lib import hyperfine_results, hyperfine_rows
h, c1, c3, c5, before, after, runs, warmup, c3b, c5b = sys.argv[1:]
res = hyperfine_results(h)
base = res[0]["mean"]
calls = [c1, c3, c5] + ([c3b, c5b] if c3b else [])
out = ["<!-- quorum:begin -->", "## 10. Quorum mode: cost per run", "",
       "`bench/quorum.sh`: `fencerun ... NAME -- true` against 1, 3 and 5 independent redis-servers on",
       f"loopback, `hyperfine -N -w {warmup} -r {runs}` (all three in one hyperfine run); Redis commands",
       "per run summed over every server (INFO commandstats: the calls scripts make inside the server",
       "included).", "",
       f"Load before: `{before}`  ", f"Load after: `{after}`", "",
       "| mode | mean | ± σ | median | vs single server (median) | Redis commands per run (all servers) |",
       "|---|---|---|---|---|---|"]
base_median = res[0]["median"]
out += hyperfine_rows(res, lambda r: f"{r['median']/base_median:.2f}x", calls)
out += ["", "<!-- quorum:end -->"]
print("\n".join(out))
PY
)"
splice_section "$doc" quorum "$section"
[[ "$doc" == "-" ]] || say "wrote the quorum section of $doc"
