#!/usr/bin/env bash
# What a run costs where users pay it, next to flock(1) and `etcdctl lock`, in one run on loopback:
#   1. per run: `fencerun -r URL NAME -- true`, `flock FILE true`, `etcdctl lock NAME -- true` in one
#      hyperfine run, runs spaced out (`--prepare 'sleep 0.1'`, as cron jobs and CI steps run) and
#      back to back (`hyperfine -N` alone, which keeps the kernel's cgroup locks warm);
#   2. hand-over latency (holder's last act to the next holder's first act, bench/handover.py) with
#      1, 4 and 16 waiters, every holder holding 100 ms (so every hand-over is spaced out too);
# each with fencerun's default containment (a cgroup of the job's own where one can be made) and with
# FENCERUN_CGROUP=off, as root and as the unprivileged user nobody (who gets no cgroup: its
# containment is the process group either way). BASELINE=path measures an older fencerun in the same
# runs (before/after). Nothing is measured while the load average is above 2 (it waits, up to
# LOAD_WAIT seconds, then marks the figures). Writes the section between <!-- floor:begin --> and
# <!-- floor:end --> of docs/benchmarks.md (BENCH_DOC=- prints it only).
#
#   cmake -S . -B build -G Ninja && cmake --build build --target fencerun && bench/floor.sh
#
# Environment: FENCERUN=path BASELINE=path BASELINE_NAME=s BENCH_DOC=path RUNS=40 SAMPLES=30
#   HOLD_MS=100 USERS="root nobody" LOAD_WAIT=900
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fencerun="$(realpath "${FENCERUN:-$repo/build/src/fencerun}")"
baseline="${BASELINE:+$(realpath "$BASELINE")}"
baseline_name="${BASELINE_NAME:-baseline build}"
doc="${BENCH_DOC:-$repo/docs/benchmarks.md}"
runs="${RUNS:-40}"
samples="${SAMPLES:-30}"
hold_ms="${HOLD_MS:-100}"
users="${USERS:-root nobody}"
load_wait="${LOAD_WAIT:-900}"
command_line="bench/floor.sh"
for v in FENCERUN BASELINE BASELINE_NAME RUNS SAMPLES HOLD_MS USERS; do
  [[ -n "${!v:-}" ]] && command_line="$v=${!v} $command_line"
done

say() { echo "floor.sh: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"
((EUID == 0)) || die "run as root: it measures as root and as nobody (runuser)"
need redis-server redis-server
need redis-cli redis-tools
need etcd etcd-server
need etcdctl etcd-client
need hyperfine hyperfine
need flock util-linux
need python3 python3
install_missing

work="$(mktemp -d /tmp/fencerun-floor.XXXXXX)"
chmod 1777 "$work"  # nobody writes its results here too
# shellcheck disable=SC2034  # etcd_data_note and peer_port are start_etcd's (bench/lib.sh)
redis_pid="" etcd_pid="" etcd_data="" etcd_data_note=""
cleanup() {
  for p in $redis_pid $etcd_pid; do
    kill "$p" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  [[ -n "$etcd_data" ]] && rm -rf "$etcd_data"
  rm -rf "$work"
}
trap cleanup EXIT

redis_port="$(free_port)"
etcd_port="$(free_port)"
# shellcheck disable=SC2034  # used by start_etcd
peer_port="$(free_port)"
endpoint="http://127.0.0.1:$etcd_port"
# shellcheck disable=SC2119
start_redis
start_etcd floor
export ETCDCTL_API=3
url="redis://127.0.0.1:$redis_port"
# Binaries where nobody can run them.
install -m 755 "$fencerun" "$work/fencerun"
[[ -n "$baseline" ]] && install -m 755 "$baseline" "$work/fencerun-base"

load1() { cut -d' ' -f1 /proc/loadavg; }
settle() {
  local waited=0
  while awk -v l="$(load1)" 'BEGIN { exit !(l > 2) }'; do
    ((waited >= load_wait)) && { say "load still $(load1) after ${load_wait}s: measuring anyway (marked)"; return; }
    say "load average $(load1) > 2: waiting"
    sleep 15
    waited=$((waited + 15))
  done
}
as() { if [[ "$1" == root ]]; then shift; "$@"; else local u="$1"; shift; runuser -u "$u" -- "$@"; fi; }

# --- 1. per run ------------------------------------------------------------------------------------
for user in $users; do
  for containment in default off; do
    for spacing in spaced b2b; do
      settle
      tag="$user-$containment-$spacing"
      name="floor-$tag"
      cmds=("flock $work/flock-$tag true" "$work/fencerun -r $url $name -- true")
      [[ -n "$baseline" ]] && cmds+=("$work/fencerun-base -r $url $name-b -- true")
      cmds+=("etcdctl --endpoints=$endpoint lock $name -- true")
      opts=(-N --warmup 5 --runs "$runs" --export-json "$work/run-$tag.json")
      [[ "$spacing" == spaced ]] && opts+=(--prepare "sleep 0.1")
      env=(env)
      [[ "$containment" == off ]] && env+=(FENCERUN_CGROUP=off) || env+=(-u FENCERUN_CGROUP)
      load1 >"$work/load-$tag"
      say "per run: $tag"
      as "$user" "${env[@]}" hyperfine "${opts[@]}" "${cmds[@]}" >/dev/null 2>"$work/hyperfine-$tag.log" ||
        die "hyperfine failed ($tag): $(tail -5 "$work/hyperfine-$tag.log")"
      # Which containment the runs had: what fencerun logs at -vv, as this user, in this environment.
      as "$user" "${env[@]}" "$work/fencerun" -vv -r "$url" "$name" -- true 2>&1 |
        sed -n 's/.*containment: \([a-z ]*\).*/\1/p' | head -1 >"$work/containment-$tag"
    done
  done
done

# --- 2. hand-over latency --------------------------------------------------------------------------
tools="flock,fencerun${baseline:+,fencerun-base},etcd"
for user in $users; do
  for containment in default off; do
    settle
    tag="$user-$containment"
    mkdir -p "$work/ho-$tag" && chmod 777 "$work/ho-$tag"
    env=(env)
    [[ "$containment" == off ]] && env+=(FENCERUN_CGROUP=off) || env+=(-u FENCERUN_CGROUP)
    load1 >"$work/load-ho-$tag"
    say "hand-over: $tag"
    as "$user" "${env[@]}" python3 "$repo/bench/handover.py" latency --fencerun "$work/fencerun" \
      ${baseline:+--baseline "$work/fencerun-base"} --redis-port "$redis_port" --etcd-endpoint "$endpoint" \
      --work "$work/ho-$tag" --tools "$tools" --waiters 1,4,16 --samples "$samples" --hold-ms "$hold_ms" \
      >"$work/ho-$tag.json" 2>"$work/ho-$tag.log" || die "handover.py failed ($tag): $(tail -5 "$work/ho-$tag.log")"
  done
done

# --- the tables ------------------------------------------------------------------------------------
commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$repo" diff --quiet HEAD -- src 2>/dev/null || commit="$commit with uncommitted changes in src/"
bench_python - "$work" "$doc" "$users" "$baseline_name" "$command_line" "$commit" "$runs" "$samples" "$hold_ms" \
  "$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')" "$(etcd --version | sed -n 's/etcd Version: //p')" \
  "${baseline:+yes}" <<'EOF'
import json, os, statistics, sys, time
from lib import block, hyperfine_results, splice
work, doc, users, base_name, cmdline, commit, runs, samples, hold, redis_v, etcd_v, has_base = sys.argv[1:13]
users = users.split()
out = []
w = out.append
def load(tag):
    try:
        return open(os.path.join(work, "load-" + tag)).read().strip()
    except OSError:
        return "?"
def flag(l):
    return " ⚠" if l != "?" and float(l) > 2 else ""
w("## 0. Per run and hand-over, where users pay them (containment on and off)")
w("")
w(f"`{cmdline}` at commit {commit}, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}; "
  f"{os.cpu_count()} CPUs, Linux {os.uname().release}; Redis {redis_v}, etcd {etcd_v} (one member, data on tmpfs), "
  "all on loopback. The load average (1 min) at the start of each row is given; ⚠ marks a row taken above 2.")
w("")
w("**Containment**: *default* is what fencerun does unasked (a cgroup of the job's own where one can be made: as "
  "root here; nobody has no writable cgroup and runs the job in its process group); *off* is `FENCERUN_CGROUP=off`. "
  "The containment column says what fencerun logged (`-vv`) in each row.")
w("")
w(f"### Per run: `fencerun -r URL NAME -- true`, `flock FILE true`, `etcdctl lock NAME -- true`")
w("")
w(f"One hyperfine run per row (`hyperfine -N --warmup 5 --runs {runs}`), the tools side by side; median wall time. "
  "*spaced*: `--prepare 'sleep 0.1'` (a run every ~0.1 s, as cron jobs and CI steps run); *back to back*: none.")
w("")
head = "| user | containment | spacing | flock | fencerun | ratio |"
sep = "|---|---|---|---|---|---|"
if has_base:
    head += f" {base_name} | ratio |"
    sep += "---|---|"
head += " etcdctl lock | load |"
sep += "---|---|"
w(head); w(sep)
for user in users:
    for cont in ("default", "off"):
        for spacing in ("spaced", "b2b"):
            tag = f"{user}-{cont}-{spacing}"
            try:
                res = hyperfine_results(os.path.join(work, f"run-{tag}.json"))
            except OSError:
                continue
            med = [statistics.median(r["times"]) * 1000 for r in res]
            try:
                mode = open(os.path.join(work, "containment-" + tag)).read().strip() or "?"
            except OSError:
                mode = "?"
            l = load(tag)
            row = f"| {user} | {cont}: {mode} | {'spaced' if spacing == 'spaced' else 'back to back'} | {med[0]:.2f} ms | {med[1]:.2f} ms | {med[1] / med[0]:.2f}x |"
            i = 2
            if has_base:
                row += f" {med[2]:.2f} ms | {med[2] / med[0]:.2f}x |"
                i = 3
            row += f" {med[i]:.2f} ms | {l}{flag(l)} |"
            w(row)
w("")
w("### Hand-over latency: the previous holder's last act to the next holder's first act")
w("")
w(f"`bench/handover.py latency --waiters 1,4,16 --samples {samples} --hold-ms {hold}`: every holder runs "
  f"`date +%s%N; sleep {int(hold) / 1000:g}; date +%s%N`, so each hand-over comes {hold} ms after the previous "
  "one (spaced out); the gap between one holder's last stamp and the next one's first is the hand-over, "
  "`date`'s own start included on both sides. Median (p99) of the samples, in ms.")
w("")
labels = {"flock": "flock", "fencerun": "fencerun", "fencerun-base": base_name, "etcd": "etcdctl lock"}
tools = ["flock", "fencerun"] + (["fencerun-base"] if has_base else []) + ["etcd"]
w("| user | containment | waiters | " + " | ".join(labels[t] for t in tools) + " | fencerun / flock | load |")
w("|---|---|---|" + "---|" * len(tools) + "---|---|")
for user in users:
    for cont in ("default", "off"):
        tag = f"{user}-{cont}"
        try:
            res = json.load(open(os.path.join(work, f"ho-{tag}.json")))
        except (OSError, ValueError):
            continue
        cell = {(r["tool"], r["waiters"]): r for r in res}
        l = load("ho-" + tag)
        for n in (1, 4, 16):
            cells = []
            for t in tools:
                r = cell.get((t, n), {})
                c = f"{r['median_ms']:.2f} ({r['p99_ms']:.2f})" if r.get("n") else "-"
                if r.get("overlaps"):
                    c += f" OVERLAPS {r['overlaps']}"
                cells.append(c)
            f, g = cell.get(("flock", n), {}), cell.get(("fencerun", n), {})
            ratio = f"{g['median_ms'] / f['median_ms']:.2f}x" if f.get("n") and g.get("n") and f["median_ms"] > 0 else "-"
            w(f"| {user} | {cont} | {n} | " + " | ".join(cells) + f" | {ratio} | {l}{flag(l)} |")
w("")
section = block("floor", "\n".join(out))
splice(doc, "floor", section)  # doc "-": prints it only
if doc != "-":
    print(section + "\n")
EOF
