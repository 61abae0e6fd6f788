#!/usr/bin/env python3
"""Several holders at once (--limit N): hand-over rate and cost (bench/limit.sh runs it; standard library only).

    limit.py sweep  --results DIR --tools T,.. --limits 1,2,4 --contenders 16 --many 64 ...   one JSON per cell
    limit.py report --results DIR --doc docs/benchmarks.md                                     the section

A cell is one tool, one limit N and a number of contenders C on a fresh lock name. Each of the C
contenders runs `TOOL ... NAME -- CMD` in a loop, waiting for a slot; CMD holds its slot for --hold-ms
and logs when it started and ended, and which slot it held. After --warmup seconds the counters are
read, then again --seconds later; the runs that ended in between are the cell's hand-overs.

Tools:
  fencerun        fencerun --wait inf --limit N NAME -- CMD
  fencerun-fair   the same with --fair
  flock           N=1: flock FILE CMD. N>1: N lock files; a contender tries them with `flock -n` in turn,
                  starting at file (i mod N), and when all are busy blocks in `flock` on file (i mod N)
  poll            a redis-cli client: SET slot:0..N-1 NX PX in turn, sleep the poll interval when all
                  are busy, run CMD, compare-and-delete its slot with EVAL (no token, no renewal)
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.dont_write_bytecode = True  # no bench/__pycache__ from the imports below
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from handover import Workers, env_for_tools  # noqa: E402  (the contender loops of section 4)
import lib  # noqa: E402  (the section of docs/benchmarks.md: lib.splice)
from waiters import Redis, loadavg  # noqa: E402

TOOL_LABELS = {
    "fencerun": "fencerun --limit N",
    "fencerun-fair": "fencerun --fair --limit N",
    "flock": "flock(1), N lock files",
    "poll": "redis-cli polling, N slots",
}
REDIS_TOOLS = ("fencerun", "fencerun-fair", "poll")

# With N > 1 flock(1) has no counting mode: try the N files without blocking, then block on one.
FLOCK_N = r'''
d=$1 n=$2 i=$3; shift 3
k=0
while [ "$k" -lt "$n" ]; do
  s=$(( (i + k) % n ))
  BENCH_SLOT=$s flock -n -E 75 "$d/slot.$s" "$@"; rc=$?
  [ "$rc" -ne 75 ] && exit "$rc"
  k=$((k + 1))
done
s=$((i % n))
BENCH_SLOT=$s exec flock -E 75 "$d/slot.$s" "$@"
'''


def say(*args):
    print("limit.py:", *args, file=sys.stderr, flush=True)


def load_text():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def settle(max_load, limit):
    """Waits up to `limit` seconds for the 1-minute load average to fall below `max_load`; returns
    (seconds waited, whether it fell)."""
    began = time.monotonic()
    while loadavg()[0] >= max_load and time.monotonic() - began < limit:
        time.sleep(2)
    return round(time.monotonic() - began, 1), loadavg()[0] < max_load


def hold_command(a, log):
    # bash for $EPOCHREALTIME (no `date` process per stamp); the slot from fencerun, or from the
    # flock and polling wrappers (BENCH_SLOT). One line per run, written with a single echo at the end.
    return ["bash", "-c",
            's=$EPOCHREALTIME; sleep "$1"; e=$EPOCHREALTIME; '
            'echo "${FENCERUN_SLOT:-${BENCH_SLOT:-0}} ${FENCERUN_TOKEN:-0} $s $e" >> "$2"',
            "hold", f"{a.hold_ms / 1000:.3f}", log]


def tool_argv(a, tool, name, n, i, command, d):
    url = f"redis://127.0.0.1:{a.redis_port}"
    if tool in ("fencerun", "fencerun-fair"):
        argv = [a.fencerun, "-r", url, "--wait", "inf", "--limit", str(n)]
        if tool == "fencerun-fair":
            argv.append("--fair")
        return argv + [name, "--"] + command
    if tool == "flock":
        if n == 1:
            return ["flock", os.path.join(d, "slot.0")] + command
        return ["sh", "-c", FLOCK_N, "flock-n", d, str(n), str(i)] + command
    if tool == "poll":
        return ["sh", a.poll_script, str(a.redis_port), name, str(n), str(a.poll_ms), "30000"] + command
    raise SystemExit(f"unknown tool {tool}")


def check_runs(lines, n):
    """Most runs at once (must be <= n), overlaps within one slot (must be 0), slots seen, tokens
    repeated (must be 0; fencerun only)."""
    runs = []
    for line in lines:
        parts = line.split()
        if len(parts) != 4:
            continue
        slot, token, s, e = parts
        runs.append((slot, int(token), float(s), float(e)))
    events = sorted([(s, 1) for _, _, s, _ in runs] + [(e, -1) for _, _, _, e in runs], key=lambda x: (x[0], x[1]))
    cur = most = 0
    for _, d in events:
        cur += d
        most = max(most, cur)
    same_slot = 0
    by_slot = {}
    for slot, _, s, e in runs:
        by_slot.setdefault(slot, []).append((s, e))
    for spans in by_slot.values():
        spans.sort()
        same_slot += sum(1 for (s0, e0), (s1, _) in zip(spans, spans[1:]) if s1 < e0)
    tokens = [t for _, t, _, _ in runs if t]
    return {"runs_logged": len(runs), "most_at_once": most, "same_slot_overlaps": same_slot,
            "slots_seen": sorted(by_slot, key=lambda x: (len(x), x)),
            "repeated_tokens": len(tokens) - len(set(tokens)),
            "hold_ms_median": round(statistics.median([(e - s) * 1e3 for _, _, s, e in runs]), 1) if runs else None}


def busy_fraction(lines, n, t0, t1):
    """Share of the N slots' time inside CMD over the wall-clock window [t0, t1)."""
    inside = 0.0
    for line in lines:
        parts = line.split()
        if len(parts) != 4:
            continue
        s, e = float(parts[2]), float(parts[3])
        inside += max(0.0, min(e, t1) - max(s, t0))
    return inside / (n * (t1 - t0))


def run_cell(a, tool, n, contenders, seq):
    name = f"bl-{tool}-{n}-{contenders}-{os.getpid()}-{seq}"
    d = os.path.join(a.work, name)
    os.makedirs(d)
    log = os.path.join(d, "runs")
    for k in range(n):
        open(os.path.join(d, f"slot.{k}"), "w").close()
    waited, settled = settle(a.max_load, a.settle)
    r = {"tool": tool, "limit": n, "contenders": contenders, "hold_ms": a.hold_ms, "name": name,
         "settle_seconds": waited, "settled": settled, "load_before": load_text(),
         "time_start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    say(f"{tool} --limit {n}, {contenders} contenders (load {r['load_before']}, waited {waited} s)")
    done = []
    lock = threading.Lock()

    def on_done(t):
        with lock:
            done.append(t)

    command = hold_command(a, log)
    argvs = [tool_argv(a, tool, name, n, i, command, d) for i in range(contenders)]
    rc = Redis(a.redis_port) if tool in REDIS_TOOLS else None
    w = Workers(argvs, env_for_tools(), on_done)
    w.start()
    try:
        time.sleep(a.warmup)
        if rc:
            c0 = int(rc.info()["total_commands_processed"])
        t_go, wall_go = time.monotonic_ns(), time.time()
        time.sleep(a.seconds)
        t_stop, wall_stop = time.monotonic_ns(), time.time()
        if rc:
            # Our own commands: the first INFO (counted by the second one's figure), not the second.
            c1 = int(rc.info()["total_commands_processed"])
    finally:
        stuck = w.finish(timeout=120)
        if rc:
            rc.close()
    with lock:
        runs = sum(1 for t in done if t_go <= t < t_stop)
    window = (t_stop - t_go) / 1e9
    with open(log) as f:
        lines = f.read().splitlines()
    r.update({"seconds": round(window, 2), "runs": runs, "per_second": round(runs / window, 1),
              "slot_busy": round(busy_fraction(lines, n, wall_go, wall_stop), 3),
              "failures": w.failures[:3], "failed_runs": len(w.failures), "stuck": stuck,
              "load_after": load_text()})
    if rc and runs:
        r["commands"] = c1 - c0 - 1
        r["commands_per_handover"] = round((c1 - c0 - 1) / runs, 1)
    r.update(check_runs(lines, n))
    problems = []
    if r["most_at_once"] > n:
        problems.append(f"{r['most_at_once']} runs at once with N = {n}")
    if r["same_slot_overlaps"]:
        problems.append(f"{r['same_slot_overlaps']} overlaps within a slot")
    if r["repeated_tokens"]:
        problems.append(f"{r['repeated_tokens']} repeated tokens")
    if r["failed_runs"]:
        problems.append(f"{r['failed_runs']} failed runs: {r['failures'][0][:120]}")
    if stuck:
        problems.append(f"{stuck} contenders did not finish")
    r["problems"] = problems
    say(f"  {r['per_second']} runs/s, slots busy {r['slot_busy']:.0%}"
        + (f", {r['commands_per_handover']} commands per hand-over" if "commands_per_handover" in r else "")
        + (f"; PROBLEMS: {'; '.join(problems)}" if problems else "") + f" (load after {r['load_after']})")
    return r


def cmd_sweep(a):
    os.makedirs(a.results, exist_ok=True)
    tools = a.tools.split(",")
    limits = [int(x) for x in a.limits.split(",")]
    cells = [(t, n, a.contenders) for t in tools for n in limits]
    # The number of waiters, for fencerun only: polling from that many clients is a load test of the
    # machine (a redis-cli process per try), and flock has no server to count commands on.
    if a.many:
        cells += [(t, n, a.many) for t in tools if t in ("fencerun", "fencerun-fair") for n in limits]
    for seq, (tool, n, c) in enumerate(cells):
        r = run_cell(a, tool, n, c, seq)
        with open(os.path.join(a.results, f"cell-{seq:02d}-{tool}-{n}-{c}.json"), "w") as f:
            json.dump(r, f, indent=1)


# --- report ---------------------------------------------------------------------------------------

def fmt(x, digits=1):
    return "n/a" if x is None else f"{x:.{digits}f}"


def section(cells, meta):
    L = []
    w = L.append
    hold = cells[0]["hold_ms"] if cells else 50
    limits = sorted({c["limit"] for c in cells})
    w("## 9. Several holders (`--limit N`): hand-over rate and cost")
    w("")
    w("C contenders each run a tool in a loop on one lock name, waiting for one of its N slots; the")
    w(f"command holds its slot for {hold} ms (`bash -c 's=$EPOCHREALTIME; sleep {hold / 1000:g}; e=$EPOCHREALTIME;")
    w("echo SLOT TOKEN $s $e >>LOG'`) and logs when it ran and in which slot. After "
      f"{meta.get('warmup', '?')} s of warm-up the runs that end")
    w(f"within the next {meta.get('seconds', '?')} s are counted: every run is one hand-over of a slot. The tools:")
    w("")
    w("- **fencerun**: `fencerun -r redis://127.0.0.1:PORT --wait inf --limit N NAME -- CMD` (and with")
    w("  `--fair`).")
    w("- **flock(1)**: flock has only an exclusive and a shared lock, no counting one. At N = 1 it is")
    w("  `flock FILE CMD`. At N > 1 each contender has N lock files: it tries them with `flock -n` in turn")
    w("  (starting at file i mod N, so contenders spread), and when all are busy blocks in `flock` on file")
    w("  i mod N. The blocked waiter then waits for that one file, even when another one frees first, so")
    w("  this is not a true semaphore: it is the simplest honest one flock gives. Every `flock -n` try is a")
    w("  process of its own (the `sh` that loops over the files is one more per run).")
    w(f"- **redis-cli polling** (the loop of a consul-style semaphore, without its blocking queries): "
      f"`SET PREFIX:slot:I VALUE NX PX 30000`")
    w(f"  for I = 0..N-1 in turn, one `redis-cli` each, sleeping {meta.get('poll_ms', 100)} ms when all are busy; then")
    w("  CMD, then a compare-and-delete of its slot with `EVAL`. No token, no renewal, no stop before")
    w("  expiry: the cheapest correct-looking client (as bench/redis-lock.sh is for one holder).")
    w("")
    w("- **runs/s**: runs that ended in the window, per second. **slots busy**: the share of the N slots'")
    w("  time spent inside CMD over the window (what is left is hand-overs: a holder exiting, releasing,")
    w("  the next one waking, acquiring and starting CMD); the ceiling of runs/s is about N × 1000 /")
    w(f"  (hold + the start of `bash` and `sleep`), {1000 / hold:.0f} × N at most for a {hold} ms hold.")
    w("- **commands / hand-over**: Redis `INFO stats` total_commands_processed over the window (which")
    w("  counts the commands scripts run inside the server too; the benchmark's own INFO left out), divided")
    w("  by the runs. It includes each run's arrival (first try, subscription, queueing), its acquire, its")
    w("  renewals if any, its release and the wake-up of the next waiter. The scripts of a counting lock")
    w("  look at each of its N slots (a `PTTL` each) when they acquire or release, and these count too.")
    w(f"- **CMD median**: how long CMD took from its first stamp to its last, median (nominally {hold} ms: more")
    w("  means `sleep` waited for a CPU, which lowers runs/s for every tool of that cell alike).")
    w("- **most at once**: the largest number of runs whose CMD overlapped in time, from the log (must be")
    w("  at most N); **slot overlaps**: runs of one slot that overlapped (must be 0).")
    w("- **load**: /proc/loadavg (what `uptime` prints) before the cell → after it. Before each cell the")
    w(f"  sweep waits (up to {meta.get('settle', '?')} s) for the 1-minute average to fall below "
      f"{meta.get('max_load', 2)}; a cell that")
    w("  started above it is marked ⚠.")
    w("")
    if meta:
        w("Made with")
        w("")
        w("```")
        w(meta.get("command", "bench/limit.sh"))
        w("```")
        w("")
        w(f"on {meta.get('date', '?')}, {meta.get('nproc', '?')} CPUs ({meta.get('cpu', '?')}), Linux "
          f"{meta.get('kernel', '?')}; uptime before: `{meta.get('uptime_start', '?')}`, after: "
          f"`{meta.get('uptime_end', '?')}`; {meta.get('fencerun_version', '?')} ({meta.get('revision', '?')}, "
          f"binary {meta.get('binary', '?')}); {meta.get('redis_version', '?')} (`--save '' --appendonly no`); "
          f"{meta.get('flock_version', '?')}. The run took {meta.get('seconds_total', '?')} s.")
        w("")
    if meta.get("smoke"):
        w(f"**Smoke run ({meta['smoke']}): not the figures of the full sweep.**")
        w("")

    def row(c):
        t = c["tool"]
        label = TOOL_LABELS.get(t, t).replace(" N", f" {c['limit']}", 1) if t.startswith("fencerun") else TOOL_LABELS.get(t, t)
        status = "ok" if not c.get("problems") else "; ".join(c["problems"])[:160]
        cmds = fmt(c.get("commands_per_handover")) if t in REDIS_TOOLS else "— (no server)"
        warn = "" if c.get("settled", True) else " ⚠"
        return (f"| {label} | {c['limit']} | {c['contenders']} | {fmt(c.get('per_second'))} | "
                f"{c.get('slot_busy', 0):.0%} | {fmt(c.get('hold_ms_median'), 0)} ms | {cmds} | {c.get('most_at_once', 'n/a')} | "
                f"{c.get('same_slot_overlaps', 'n/a')} | {status} | {c['load_before']} → {c['load_after']}{warn} |")

    head = ("| tool | N | contenders | runs/s | slots busy | CMD median | commands / hand-over | most at once "
            "| slot overlaps | status | load before → after |")
    sep = "|---|---|---|---|---|---|---|---|---|---|---|"
    main_c = max((c["contenders"] for c in cells), key=lambda x: sum(1 for c in cells if c["contenders"] == x))
    w(f"Hand-over rate with {main_c} contenders:")
    w("")
    w(head)
    w(sep)
    order = {t: i for i, t in enumerate(TOOL_LABELS)}
    for c in sorted((c for c in cells if c["contenders"] == main_c), key=lambda c: (c["limit"], order.get(c["tool"], 9))):
        w(row(c))
    w("")
    many = sorted({c["contenders"] for c in cells if c["contenders"] != main_c})
    if many:
        w("Commands per hand-over against the number of contenders (fencerun only: "
          "polling from that many")
        w("clients mostly measures the machine starting `redis-cli` processes, and flock has no server):")
        w("")
        cs = [main_c] + many
        w("| tool | N | " + " | ".join(f"{x} contenders: runs/s, commands / hand-over" for x in cs) + " | load before → after |")
        w("|---|---|" + "---|" * len(cs) + "---|")
        for t in ("fencerun", "fencerun-fair"):
            for n in limits:
                got = {c["contenders"]: c for c in cells if c["tool"] == t and c["limit"] == n}
                if not all(x in got for x in cs):
                    continue
                parts = []
                for x in cs:
                    c = got[x]
                    bad = f" ({'; '.join(c['problems'])[:80]})" if c.get("problems") else ""
                    parts.append(f"{fmt(c.get('per_second'))}, {fmt(c.get('commands_per_handover'))}{bad}")
                loads = "; ".join(f"{got[x]['load_before']} → {got[x]['load_after']}"
                                  + ("" if got[x].get("settled", True) else " ⚠") for x in cs)
                w(f"| {TOOL_LABELS[t].replace(' N', '')} | {n} | " + " | ".join(parts) + f" | {loads} |")
        w("")
        ratios = []
        for t in ("fencerun", "fencerun-fair"):
            for n in limits:
                got = {c["contenders"]: c.get("commands_per_handover") for c in cells if c["tool"] == t and c["limit"] == n}
                lo, hi = got.get(main_c), got.get(many[-1])
                if lo and hi:
                    ratios.append(f"{TOOL_LABELS[t].replace(' N', ' ' + str(n))}: {hi / lo:.2f}x")
        if ratios:
            w(f"Commands per hand-over with {many[-1]} contenders against {main_c}: " + "; ".join(ratios) + ".")
            w("")
    w("Raw results (one JSON file per cell): the results directory that bench/limit.sh prints;")
    w("`bench/limit.py report --results DIR --doc docs/benchmarks.md` writes this section again from it.")
    w("Written by bench/limit.sh; bench/handover.py, bench/waiters.py and bench/startup.sh keep this section.")
    return "\n".join(L)


def placeholder():
    return "\n".join([
        "## 9. Several holders (`--limit N`): hand-over rate and cost",
        "",
        "Runs per second with 16 contenders at `--limit` 1, 2 and 4, next to flock(1) with N lock files and",
        "a redis-cli client polling N slots; Redis commands per hand-over at 16 and 64 contenders.",
        "No figures yet: run bench/limit.sh (it writes this section).",
    ])


def replace_section(doc, body):
    lib.splice(doc, "limit", lib.block("limit", body))


def cmd_report(a):
    if a.placeholder:
        replace_section(a.doc, placeholder())
        return
    cells = []
    for f in sorted(os.listdir(a.results)):
        if f.startswith("cell-") and f.endswith(".json"):
            with open(os.path.join(a.results, f)) as fh:
                cells.append(json.load(fh))
    if not cells:
        raise SystemExit(f"no cell-*.json in {a.results}")
    meta = {}
    mp = os.path.join(a.results, "meta.json")
    if os.path.exists(mp):
        with open(mp) as f:
            meta = json.load(f)
    body = section(cells, meta)
    if a.doc == "-":
        print(body)
    else:
        replace_section(a.doc, body)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["sweep", "report"])
    p.add_argument("--fencerun")
    p.add_argument("--redis-port", type=int)
    p.add_argument("--poll-script", help="the polling client (bench/limit.sh writes it)")
    p.add_argument("--poll-ms", type=int, default=100)
    p.add_argument("--work", default="/tmp")
    p.add_argument("--tools", default="fencerun,fencerun-fair,flock,poll")
    p.add_argument("--limits", default="1,2,4")
    p.add_argument("--contenders", type=int, default=16)
    p.add_argument("--many", type=int, default=64, help="fencerun again with this many contenders (0: not)")
    p.add_argument("--hold-ms", type=int, default=50)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--warmup", type=float, default=1.5)
    p.add_argument("--max-load", type=float, default=2.0)
    p.add_argument("--settle", type=float, default=180)
    p.add_argument("--results")
    p.add_argument("--doc")
    p.add_argument("--placeholder", action="store_true", help="report: write the placeholder section only")
    a = p.parse_args()
    {"sweep": cmd_sweep, "report": cmd_report}[a.what](a)


if __name__ == "__main__":
    main()
