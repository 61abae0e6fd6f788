#!/usr/bin/env bash
# What --every costs per run, next to a plain run and to --min-interval, in one hyperfine run on
# loopback (fencerun NAME -- true) against one redis-server without persistence:
#   plain                 no rule (the record of runs is kept all the same)
#   --min-interval 1ms    every run passes the check
#   --every 1ms           every run is the first of its slot (each millisecond a slot)
#   --every 1h, skipped   a success of this hour is recorded: the command is not started
# and, per run, the commands clients sent (MONITOR, the calls scripts make inside the server left out)
# and the round trips (writes on the Redis socket, with strace when it is installed). The rows of a
# quorum of 3 and a one-member etcd are added when this fencerun accepts --every there. The load
# average is recorded before and after; nothing is measured while it is at or above the number of CPUs
# (waits up to LOAD_WAIT seconds). Writes the section between <!-- slots:begin --> and
# <!-- slots:end --> of docs/benchmarks.md (appended at the end the first time).
#
#   bench/slots.sh
#
# Environment: FENCERUN=path (default build/src/fencerun), BENCH_DOC=path (default docs/benchmarks.md;
# - prints only), RUNS=100 WARMUP=10 LOAD_WAIT=600, LOAD_MAX=N.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fencerun="$(realpath "${FENCERUN:-$repo/build/src/fencerun}")"
doc="${BENCH_DOC:-$repo/docs/benchmarks.md}"
runs="${RUNS:-100}"
warmup="${WARMUP:-10}"
load_wait="${LOAD_WAIT:-600}"

say() { echo "slots.sh: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"
need redis-server redis-server
need redis-cli redis-tools
need hyperfine hyperfine
need etcd etcd-server
need etcdctl etcd-client
install_missing

work="$(mktemp -d "${TMPDIR:-/tmp}/fencerun-slots.XXXXXX")"
ports=()
etcd_pid="" etcd_data=""
cleanup() {
  for p in "${ports[@]}"; do redis-cli -p "$p" SHUTDOWN NOSAVE >/dev/null 2>&1 || true; done
  [[ -n "$etcd_pid" ]] && kill "$etcd_pid" 2>/dev/null && { wait "$etcd_pid" 2>/dev/null || true; }
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
start_etcd slots

r() { local a=""; for p in "$@"; do a+=" -r redis://127.0.0.1:$p"; done; echo "$a"; }
one="$(r "${ports[0]}")"
three="$(r "${ports[@]}")"
e=" -r etcd://127.0.0.1:$etcd_port --ttl 10s"
# name|command (the first run of each succeeds, and gives the skipped rows their success)
rows=(
  "one server, plain|$fencerun$one p1 -- true"
  "one server, --min-interval 1ms|$fencerun$one --min-interval 1ms m1 -- true"
  "one server, --every 1ms|$fencerun$one --every 1ms e1 -- true"
  "one server, --every 1h, skipped|$fencerun$one --every 1h s1 -- true"
)
# shellcheck disable=SC2086
if $fencerun$three --every 1h probe3 -- true 2>/dev/null; then
  rows+=("quorum of 3, plain|$fencerun$three p3 -- true"
         "quorum of 3, --every 1ms|$fencerun$three --every 1ms e3 -- true"
         "quorum of 3, --every 1h, skipped|$fencerun$three --every 1h s3 -- true")
fi
# shellcheck disable=SC2086
if $fencerun$e --every 1h probee -- true 2>/dev/null; then
  rows+=("etcd, plain|$fencerun$e pe -- true"
         "etcd, --every 1ms|$fencerun$e --every 1ms ee -- true"
         "etcd, --every 1h, skipped|$fencerun$e --every 1h se -- true")
fi
args=()
for row in "${rows[@]}"; do
  IFS='|' read -r name cmd <<<"$row"
  # shellcheck disable=SC2086
  $cmd || die "\`$cmd\` failed"
  args+=(-n "$name" "$cmd")
done

# Per run of the one-server rows: client commands (MONITOR, without the lines a script ran) and
# round trips (sendto/write calls on sockets, by strace, when installed).
port="${ports[0]}"
client_commands() {  # CMD: the commands clients sent during 20 runs of CMD, per run
  local out="$work/monitor" pid
  redis-cli -p "$port" MONITOR >"$out" &
  pid=$!
  for _ in $(seq 100); do [[ -s "$out" ]] && break; sleep 0.02; done
  # shellcheck disable=SC2086
  for _ in $(seq 20); do $1 >/dev/null 2>&1 || true; done
  sleep 0.2
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local n
  n="$(grep -E '^[0-9]+\.[0-9]+ \[[0-9]+ ' "$out" | grep -vc ' lua\]' || true)"
  awk -v n="$n" 'BEGIN {printf "%.1f", n / 20}'
}
round_trips() {  # CMD: writes on fencerun's sockets in one run (strace), or "-"
  command -v strace >/dev/null || { echo "-"; return; }
  # shellcheck disable=SC2086
  strace -f -qq -e trace=sendto,sendmsg,write -o "$work/strace" $1 >/dev/null 2>&1 || true
  grep -cE '^[0-9]+ +(sendto|sendmsg)\(' "$work/strace" || true
}
cmds=() trips=()
for row in "${rows[@]}"; do
  IFS='|' read -r name cmd <<<"$row"
  if [[ "$name" == "one server"* ]]; then
    cmds+=("$(client_commands "$cmd")")
    trips+=("$(round_trips "$cmd")")
  else
    cmds+=("-")
    trips+=("$(round_trips "$cmd")")
  fi
done

wait_for_quiet "$load_wait"
hyperfine -N -w "$warmup" -r "$runs" --style basic --export-json "$work/h.json" "${args[@]}" >/dev/null
load_after="$(uptime)"

extra=()
for i in "${!cmds[@]}"; do extra+=("${cmds[$i]}|${trips[$i]}"); done
section="$(bench_python - "$work/h.json" "$load_before" "$load_after" "$runs" "$warmup" "$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)" "${extra[@]}" <<'PY'
import sys
from lib import hyperfine_results, hyperfine_rows
h, before, after, runs, warmup, head, *extra = sys.argv[1:]
res = hyperfine_results(h)
out = ["<!-- slots:begin -->", "## 14. Once per schedule slot (`--every`): cost per run", "",
       "`bench/slots.sh`: `fencerun ... NAME -- true` on loopback against redis-servers without",
       "persistence (and a one-member etcd with `--ttl 10s`, data on tmpfs), all rows in one",
       f"`hyperfine -N -w {warmup} -r {runs}` run. Commands: what clients sent per run (MONITOR, the calls",
       "scripts make inside the server left out; one server's rows). Sends: `sendto`/`sendmsg` calls of",
       "one run under strace, each a request or a pipeline of requests (a round trip). `--every 1ms` makes",
       "every run the first of its slot; `--every 1h, skipped` finds this hour's success.",
       f"fencerun at {head}.", "",
       f"Load before: `{before}`  ", f"Load after: `{after}`", "",
       "| run | mean | ± σ | median | commands per run | sends per run |", "|---|---|---|---|---|---|"]
out += hyperfine_rows(res, [e.split("|")[0] for e in extra], [e.split("|")[1] for e in extra])
out += ["", "<!-- slots:end -->"]
print("\n".join(out))
PY
)"
splice_section "$doc" slots "$section"
[[ "$doc" == "-" ]] || say "wrote the slots section of $doc"
