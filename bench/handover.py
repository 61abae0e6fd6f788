#!/usr/bin/env python3
"""Measurements for bench/handover.sh that need many processes and fine timing (standard library only).

    handover.py latency    --tools T,.. --waiters 1,4,16 --samples N --hold-ms MS   hand-over latency
    handover.py throughput --tools T,.. --contenders 16 --seconds S                 hand-overs per second
    handover.py stop       --repeats N                                              stop latency, renewals blocked
    handover.py rss        --tools T,.. --repeats N                                 peak and waiting RSS
    handover.py report     --results DIR --doc FILE --plot FILE                     markdown + gnuplot

Common options say where the servers are (--redis-port, --redis-pid, --etcd-endpoint) and which
binaries to run (--fencerun, --lock-script). Every measuring subcommand prints one JSON document.
Tools: fencerun, fencerun-fair, fencerun-base (--baseline), etcd (etcdctl lock), fencerun-etcd (fencerun
-r etcd://, the members of --etcd-endpoint, comma-separated), poll (redis-lock.sh,
retries every 100 ms), flock. FENCERUN_CGROUP in the environment is passed on to fencerun.
"""
import argparse
import json
import math
import os
import select
import signal
import statistics
import subprocess
import sys
import threading
import time

import lib  # the markers of the sections of docs/benchmarks.md (bench/lib.py)

TOOL_LABELS = {
    "fencerun": "fencerun",
    "fencerun-fair": "fencerun --fair",
    "fencerun-base": "fencerun (baseline build)",
    "etcd": "etcdctl lock",
    "fencerun-etcd": "fencerun on etcd",
    "poll": "redis-cli script (100 ms polling)",
    "flock": "flock(1)",
}


def tool_argv(a, tool, name, command, wait=True):
    """argv that runs `command` under lock `name` with `tool`, waiting for it when `wait`."""
    url = f"redis://127.0.0.1:{a.redis_port}"
    if tool in ("fencerun", "fencerun-fair", "fencerun-base"):
        argv = [a.baseline if tool == "fencerun-base" else a.fencerun, "-r", url]
        if wait:
            argv += ["--wait", "inf"]
        if tool == "fencerun-fair":
            argv.append("--fair")
        return argv + [name, "--"] + command
    if tool == "etcd":
        return ["etcdctl", f"--endpoints={a.etcd_endpoint}", "lock", name, "--"] + command
    if tool == "fencerun-etcd":
        members = ",".join(e.split("://", 1)[-1] for e in a.etcd_endpoint.split(","))
        return [a.fencerun, "-r", f"etcd://{members}"] + (["--wait", "inf"] if wait else []) + [name, "--"] + command
    if tool == "poll":
        return ["sh", a.lock_script, str(a.redis_port), name, "30000", "1" if wait else "0"] + command
    if tool == "flock":
        return ["flock", os.path.join(a.work, "flock-" + name)] + command
    raise SystemExit(f"unknown tool {tool}")


def env_for_tools():
    env = dict(os.environ)
    env["ETCDCTL_API"] = "3"
    for k in ("FENCERUN_REDIS_URL", "REDIS_URL", "REDISCLI_AUTH", "FENCERUN_REDIS_PASSWORD"):
        env.pop(k, None)
    return env


def percentile(values, p):
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def summary_ms(values_ns):
    ms = [v / 1e6 for v in values_ns]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
    }


class Workers:
    """Threads that each run argv again and again until stopped; children can be killed at the end."""

    def __init__(self, argvs, env, on_done=None):
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.procs = {}
        self.failures = []
        self.on_done = on_done
        self.threads = [threading.Thread(target=self._loop, args=(i, argv, env), daemon=True)
                        for i, argv in enumerate(argvs)]

    def _loop(self, i, argv, env):
        while not self.stop.is_set():
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
            with self.lock:
                self.procs[i] = p
            _, err = p.communicate()
            end = time.monotonic_ns()
            if p.returncode != 0 and not self.stop.is_set():
                with self.lock:
                    self.failures.append(f"exit {p.returncode}: {err.decode(errors='replace').strip()[:300]}")
            elif self.on_done and p.returncode == 0:
                self.on_done(end)

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self, timeout):
        """Stop starting new runs; wait for the current ones (waiters still take their turn)."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t for t in self.threads if t.is_alive()]
        if stuck:
            with self.lock:
                for p in self.procs.values():
                    if p.poll() is None:
                        p.kill()
            for t in self.threads:
                t.join(5)
        return len(stuck)


def read_stamps(path):
    try:
        with open(path) as f:
            return sorted(int(x) for x in f.read().split())
    except FileNotFoundError:
        return []


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


# --- hand-over latency -----------------------------------------------------------------------------

def measure_latency(a, tool, waiters, samples, hold_ms, max_seconds, warmup=3):
    d = os.path.join(a.work, f"latency-{tool}-{waiters}")
    os.makedirs(d, exist_ok=True)
    acq, rel = os.path.join(d, "acq"), os.path.join(d, "rel")
    # First act: a stamp; then hold; last act: a stamp. The next holder's first stamp minus this
    # holder's last one is the hand-over, process start of `date` included on both sides.
    script = f"date +%s%N >> {acq}; sleep {hold_ms / 1000:.3f}; date +%s%N >> {rel}"
    name = f"bench-ho-{tool}-{waiters}-{os.getpid()}"
    argvs = [tool_argv(a, tool, name, ["sh", "-c", script]) for _ in range(waiters + 1)]
    w = Workers(argvs, env_for_tools())
    t0 = time.monotonic()
    w.start()
    need = samples + warmup + 1
    last, last_change = 0, time.monotonic()
    stalled = capped = False
    while True:
        n = count_lines(rel)
        if n >= need:
            break
        if n != last:
            last, last_change = n, time.monotonic()
        if time.monotonic() - last_change > 30:
            stalled = True
            break
        if time.monotonic() - t0 > max_seconds:
            capped = True
            break
        time.sleep(0.02)
    stop_ns = time.time_ns()
    stuck = w.finish(timeout=60)
    elapsed = time.monotonic() - t0
    acqs, rels = read_stamps(acq), read_stamps(rel)
    k = min(len(acqs), len(rels))
    # Mutual exclusion check: every holder ended before the next began.
    overlaps = sum(1 for i in range(k - 1) if not (acqs[i] <= rels[i] <= acqs[i + 1]))
    gaps = [acqs[i + 1] - rels[i] for i in range(k - 1) if rels[i] < stop_ns]
    gaps = gaps[warmup:warmup + samples]
    r = {"tool": tool, "waiters": waiters, "hold_ms": hold_ms, "seconds": round(elapsed, 1), "max_seconds": max_seconds,
         "overlaps": overlaps, "failures": w.failures[:3], "stalled": stalled, "capped": capped,
         "killed_at_end": stuck}
    r.update(summary_ms(gaps))
    return r


def cmd_latency(a):
    out = []
    for waiters in [int(x) for x in a.waiters.split(",")]:
        for tool in a.tools.split(","):
            r = measure_latency(a, tool, waiters, a.samples, a.hold_ms, a.max_cell_seconds)
            print(f"  hand-over {TOOL_LABELS[tool]:36} {waiters:2} waiters: median {r.get('median_ms')} ms, "
                  f"p99 {r.get('p99_ms')} ms (n={r['n']}, {r['seconds']} s)", file=sys.stderr)
            out.append(r)
    json.dump(out, sys.stdout, indent=1)


# --- throughput ------------------------------------------------------------------------------------

def cmd_throughput(a):
    out = []
    for tool in a.tools.split(","):
        done = []
        lock = threading.Lock()

        def on_done(t, done=done, lock=lock):
            with lock:
                done.append(t)

        name = f"bench-tp-{tool}-{os.getpid()}"
        argvs = [tool_argv(a, tool, name, ["true"]) for _ in range(a.contenders)]
        w = Workers(argvs, env_for_tools(), on_done)
        w.start()
        time.sleep(a.warmup)
        t_go = time.monotonic_ns()
        time.sleep(a.seconds)
        t_stop = time.monotonic_ns()
        w.finish(timeout=60)
        with lock:
            n = sum(1 for t in done if t_go <= t < t_stop)
        window = (t_stop - t_go) / 1e9
        r = {"tool": tool, "contenders": a.contenders, "seconds": round(window, 2), "runs": n,
             "per_second": round(n / window, 1), "failures": w.failures[:3]}
        print(f"  throughput {TOOL_LABELS[tool]:36} {r['per_second']} runs/s", file=sys.stderr)
        out.append(r)
    json.dump(out, sys.stdout, indent=1)


# --- stop latency ----------------------------------------------------------------------------------

def proc_dead(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def wait_dead(pid):
    """Wall-clock instant at which `pid` was seen dead: woken by its pidfd when the kernel supports it."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll(1000) and not proc_dead(pid):
                pass
            t = time.time_ns()
        finally:
            os.close(fd)
        # pidfd reports exit (zombie); a process killed while we opened the fd is gone as well.
        return t
    while not proc_dead(pid):
        time.sleep(0.0002)
    return time.time_ns()


def set_realtime(on):
    """Real-time priority for this (main) thread only, so that a busy machine does not delay the
    observer's wake-up; children started while it is off do not inherit it. False when not allowed."""
    try:
        if on:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        else:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        return True
    except (AttributeError, PermissionError, OSError):
        return False


def wait_file(path, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(path) as f:
                s = f.read()
            if s.endswith("\n"):
                return s.strip()
        except FileNotFoundError:
            pass
        time.sleep(0.0005)
    return None


def cmd_stop(a):
    ttl = a.ttl_ms
    drift = ttl // 100 + 2
    margin = min(ttl // 20, 100)
    grace = min(5000, ttl // 6)
    variants = {
        "exits on TERM": "echo $$ > {pid}; exec sleep 1000",
        # An ignored signal stays ignored across exec: this command dies only by SIGKILL.
        "ignores TERM": "trap '' TERM; echo $$ > {pid}; exec sleep 1000",
    }
    out = {"ttl_ms": ttl, "drift_ms": drift, "grace_ms": grace, "margin_ms": margin, "variants": [],
           "observer_realtime": None}
    env = env_for_tools()
    for label, template in variants.items():
        rows = []
        for rep in range(a.repeats):
            d = os.path.join(a.work, f"stop-{len(out['variants'])}-{rep}")
            os.makedirs(d, exist_ok=True)
            pidfile = os.path.join(d, "pid")
            name = f"bench-stop-{os.getpid()}-{len(out['variants'])}-{rep}"
            argv = [a.fencerun, "-r", f"redis://127.0.0.1:{a.redis_port}", "--ttl", f"{ttl}ms",
                    "--log-format", "json", name, "--", "sh", "-c", template.format(pid=pidfile)]
            # The request that acquires is written after this instant, so deadlines computed from it
            # are no later than fencerun's own: the "before deadline" figure below is conservative.
            t_launch = time.time_ns()
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
            pid_text = wait_file(pidfile, 5)
            if pid_text is None:
                p.kill()
                raise SystemExit(f"stop: the command never started: {p.communicate()[1].decode()}")
            os.kill(a.redis_pid, signal.SIGSTOP)  # renewals from now on cannot succeed
            t_frozen = time.time_ns()
            cmd_pid = int(pid_text)
            try:
                out["observer_realtime"] = set_realtime(True)
                try:
                    t_dead = wait_dead(cmd_pid)
                finally:
                    set_realtime(False)
                _, err = p.communicate(timeout=10)
            finally:
                os.kill(a.redis_pid, signal.SIGCONT)
            own = None
            for line in err.decode(errors="replace").splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("event") == "command_stopped":
                    # JSON logs give durations as <name>_ms
                    ms = ev.get("before_deadline_ms")
                    own = f"{ms}ms" if ms is not None else None
            pnr = t_launch + (ttl - drift - grace - margin) * 1_000_000
            deadline = t_launch + (ttl - drift) * 1_000_000
            rows.append({
                "exit": p.returncode,
                "frozen_after_ms": round((t_frozen - t_launch) / 1e6, 1),
                "dead_after_pnr_ms": round((t_dead - pnr) / 1e6, 1),
                "dead_before_deadline_ms": round((deadline - t_dead) / 1e6, 1),
                "fencerun_before_deadline": own,
            })
        ok = [r for r in rows if r["frozen_after_ms"] < ttl / 3]  # frozen before the first renewal
        after = [r["dead_after_pnr_ms"] for r in ok]
        before = [r["dead_before_deadline_ms"] for r in ok]
        v = {"variant": label, "runs": rows, "valid": len(ok),
             "exit_codes": sorted({r["exit"] for r in rows}),
             "median_dead_after_pnr_ms": round(statistics.median(after), 1) if ok else None,
             "max_dead_after_pnr_ms": max(after) if ok else None,
             "median_before_deadline_ms": round(statistics.median(before), 1) if ok else None,
             "min_before_deadline_ms": min(before) if ok else None,
             "fencerun_reported": [r["fencerun_before_deadline"] for r in ok]}
        print(f"  stop ({label}): dead {v['median_dead_after_pnr_ms']} ms after the point of no return, "
              f"{v['median_before_deadline_ms']} ms before the deadline (min {v['min_before_deadline_ms']})",
              file=sys.stderr)
        out["variants"].append(v)
    json.dump(out, sys.stdout, indent=1)


# --- memory ----------------------------------------------------------------------------------------

def vm_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return None


def cmd_rss(a):
    env = env_for_tools()
    out = []
    for tool in a.tools.split(","):
        peaks = []
        for rep in range(a.repeats):
            f = os.path.join(a.work, f"rss-{tool}-{rep}")
            argv = ["/usr/bin/time", "-f", "%M", "-o", f] + tool_argv(a, tool, f"bench-rss-{tool}", ["true"], wait=False)
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            with open(f) as fh:
                peaks.append(int(fh.read().split()[-1]))
        # Resident size of a process that is waiting for the lock (only the waiting process itself).
        name = f"bench-rssw-{tool}-{os.getpid()}"
        holder = subprocess.Popen(tool_argv(a, tool, name, ["sleep", "2"]), env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        waiter = subprocess.Popen(tool_argv(a, tool, name, ["true"]), env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.8)
        waiting = vm_rss_kib(waiter.pid)
        holder.wait(10)
        waiter.wait(10)
        r = {"tool": tool, "peak_kib_median": int(statistics.median(peaks)), "peaks_kib": peaks,
             "waiting_rss_kib": waiting}
        print(f"  rss {TOOL_LABELS[tool]:36} peak {r['peak_kib_median']} KiB, waiting {waiting} KiB", file=sys.stderr)
        out.append(r)
    json.dump(out, sys.stdout, indent=1)


# --- report ----------------------------------------------------------------------------------------

def load(results, name):
    with open(os.path.join(results, name)) as f:
        return json.load(f)


def ratio(x, y):
    if not x or not y:
        return "n/a"
    r = x / y
    return f"{r:.1f}x" if r >= 1.95 or r < 0.5 else f"{r:.2f}x"


def cmd_report(a):
    R = a.results
    meta = load(R, "meta.json")
    overhead = load(R, "overhead.json")
    requests = load(R, "requests.json")
    latency = load(R, "latency.json")
    throughput = load(R, "throughput.json")
    stop = load(R, "stop.json")
    rss = load(R, "rss.json")
    L = []
    w = L.append

    w("# Benchmarks: hand-over, overhead and stop latency")
    w("")
    w("fencerun next to the usual alternatives, all measured in the same run on one machine:")
    w("`flock(1)` on a local file (no network, a lower bound), `etcdctl lock` against a local etcd")
    w("(the lock waits on a watch), and a shell script that does the lock with `redis-cli`")
    w("(`SET NX PX` with a random value, run the command, Lua compare-and-delete with `EVAL`;")
    w("[bench/redis-lock.sh](../bench/redis-lock.sh)), which waits by retrying every 100 ms.")
    w("The script issues no fencing token and neither renews nor stops its command, so it is")
    w("cheaper than a tool that does; etcdctl keeps a lease alive but does not stop its command either.")
    w("")
    w("**The machine is shared with other work: absolute figures vary from run to run; compare")
    w("tools within one run (the ratios), not across runs.** Every server runs on loopback.")
    w("")
    w("## How these figures were made")
    w("")
    w("```")
    w(meta["command"])
    w("```")
    w("")
    w(f"- date: {meta['date']}")
    w(f"- machine: {meta['nproc']} CPUs, {meta['cpu']}, Linux {meta['kernel']}; load average "
      f"{meta['load_start']} at the start, {meta['load_end']} at the end")
    w(f"- versions: {meta['fencerun_version']}; {meta['redis_version']}; {meta['etcd_version']}; "
      f"{meta['hyperfine_version']}")
    w(f"- checkout: {meta.get('revision', 'an unknown revision')} (binary: {meta.get('binary', 'build/src/fencerun')})")
    w(f"- redis-server without persistence (`--save '' --appendonly no`); etcd with its data directory "
      f"on {meta['etcd_data']}; both on 127.0.0.1, ports below 32768")
    w(f"- total time of the run: {meta.get('seconds', '?')} s")
    w("")

    # (1) overhead
    w("## 1. Overhead of one guarded run of `true` (free lock)")
    w("")
    w(f"`hyperfine -N --warmup {overhead['warmup']} --runs {overhead['runs']}`, median wall time. "
      "\"added\" is the median minus bare `true`.")
    w("")
    w("| command | median | mean ± σ | added to `true` | fencerun's added time vs this | CPU (user+sys, mean) |")
    w("|---|---|---|---|---|---|")
    base = next(r for r in overhead["results"] if r["tool"] == "true")["median_ms"]
    fr = next(r for r in overhead["results"] if r["tool"] == "fencerun")
    fr_added = fr["median_ms"] - base
    for r in overhead["results"]:
        added = r["median_ms"] - base
        cmp = "" if r["tool"] in ("true", "fencerun") else ratio(fr_added, added)
        w(f"| `{r['command']}` | {r['median_ms']:.2f} ms | {r['mean_ms']:.2f} ± {r['stddev_ms']:.2f} ms | "
          f"{added:.2f} ms | {cmp} | {r['cpu_ms']:.1f} ms |")
    w("")
    w("A ratio below 1x means fencerun adds less than that alternative. CPU time is what the runs cost")
    w("the machine (children included, as hyperfine reports it); on a busy machine wall time is mostly")
    w("waiting for a CPU, and it grows with the CPU time a run needs.")
    w("")

    # (2) requests
    w("## 2. Redis requests per run")
    w("")
    w("`redis-cli MONITOR` during exactly one run; lines tagged `lua` (commands a script runs inside")
    w("the server) are left out, so every counted line is one request a client sent. (INFO commandstats")
    w("would overstate: it also counts the commands run by scripts.)")
    w("")
    w("| run | requests | commands |")
    w("|---|---|---|")
    for r in requests["runs"]:
        w(f"| {r['label']} | {r['count']} | {r['commands']} |")
    if requests.get("etcd"):
        e = requests["etcd"]
        w(f"| `etcdctl lock NAME -- true` (gRPC calls started, from etcd's /metrics) | {e['count']} | {e['calls']} |")
    w("")
    if requests.get("waiting"):
        wt = requests["waiting"]
        w(f"While waiting for a held lock, over {wt['seconds']} s (requests from MONITOR for that lock's keys;")
        w("CPU from /proc/PID/stat utime+stime, children included):")
        w("")
        w("| waiter | requests per second | CPU used while waiting |")
        w("|---|---|---|")
        for r in wt["rows"]:
            reqs = "n/a (not Redis)" if r["requests"] is None else f"{r['requests'] / wt['seconds']:.1f}"
            w(f"| {r['label']} | {reqs} | {r['cpu_ms']} ms |")
        w("")

    # (3) latency
    w("## 3. Hand-over latency")
    w("")
    n = max((r["n"] for r in latency), default=0)
    hold = latency[0]["hold_ms"] if latency else 0
    w(f"W+1 workers each run the tool in a loop on one lock, so W wait while one holds. The command")
    w(f"writes `date +%s%N` as its first act, holds {hold} ms, and writes `date +%s%N` as its last act;")
    w("a hand-over is the next holder's first stamp minus the previous holder's last stamp, so it")
    w("includes the end of one command and the start of the next (the same for every tool).")
    w(f"{n} hand-overs per cell after 3 warm-up ones (a cell that reached the time cap of")
    w(f"{latency[0].get('max_seconds', 30):.0f} s first shows its count as n=); p99 is the nearest-rank 99th percentile.")
    w("")
    tools = []
    for r in latency:
        if r["tool"] not in tools:
            tools.append(r["tool"])
    waiters = sorted({r["waiters"] for r in latency})
    cell = {(r["tool"], r["waiters"]): r for r in latency}
    w("| tool | " + " | ".join(f"{x} waiter{'s' if x > 1 else ''}: median / p99" for x in waiters) + " |")
    w("|---|" + "---|" * len(waiters))
    for t in tools:
        row = []
        for x in waiters:
            r = cell.get((t, x))
            if not r or not r.get("n"):
                row.append("n/a")
            else:
                note = f" (n={r['n']})" if r.get("capped") else ""
                row.append(f"{r['median_ms']:.1f} / {r['p99_ms']:.1f} ms{note}")
        w(f"| {TOOL_LABELS[t]} | " + " | ".join(row) + " |")
    w("")
    w("Median hand-over of each alternative relative to fencerun's (higher: fencerun is faster):")
    w("")
    w("| tool | " + " | ".join(f"{x} waiter{'s' if x > 1 else ''}" for x in waiters) + " |")
    w("|---|" + "---|" * len(waiters))
    for t in tools:
        if t == "fencerun":
            continue
        row = []
        for x in waiters:
            r, f = cell.get((t, x)), cell.get(("fencerun", x))
            row.append(ratio(r and r.get("median_ms"), f and f.get("median_ms")))
        w(f"| {TOOL_LABELS[t]} | " + " | ".join(row) + " |")
    w("")
    problems = [r for r in latency if r.get("overlaps") or r.get("failures") or r.get("stalled")]
    if problems:
        w("Problems seen: " + "; ".join(
            f"{TOOL_LABELS[r['tool']]} W={r['waiters']}: overlaps {r['overlaps']}, stalled {r['stalled']}, "
            f"failures {r['failures']}" for r in problems))
    else:
        w("Every holder's last stamp came before the next holder's first (no overlap) in every cell.")
    w("")
    w("When the load average is well above the number of CPUs, every step on the path of a hand-over")
    w("(a process exiting, a waiter waking up, a process starting) first waits for a CPU, so a tool with")
    w("fewer such steps between release and the next command looks better, and a polling waiter slows")
    w("everyone down with the CPU its tries cost (section 2).")
    w("")
    w(f"![hand-over latency by number of waiters](handover.png)")
    w("")

    # (4) throughput
    w("## 4. Throughput under contention")
    w("")
    tp0 = throughput[0] if throughput else {}
    w(f"{tp0.get('contenders')} contenders, each running `TOOL NAME -- true` in a loop (waiting for the lock),")
    w(f"counted over {tp0.get('seconds')} s after 1 s of warm-up. Every completed run is one hand-over.")
    w("")
    w("| tool | runs per second | fencerun's rate vs this |")
    w("|---|---|---|")
    frt = next((r["per_second"] for r in throughput if r["tool"] == "fencerun"), None)
    for r in throughput:
        cmp = "" if r["tool"] == "fencerun" else ratio(frt, r["per_second"])
        w(f"| {TOOL_LABELS[r['tool']]} | {r['per_second']} | {cmp} |")
    w("")

    # (5) stop latency
    w("## 5. Stop latency when renewals fail")
    w("")
    w(f"fencerun holds a lock with `--ttl {stop['ttl_ms']}ms`; right after the command starts (before the")
    w(f"first renewal at ttl/3), redis-server is stopped with SIGSTOP, so no renewal can succeed. fencerun")
    w(f"must signal the command at the point of no return, deadline − grace − margin, and have it dead")
    w(f"before the deadline = acquire + ttl − drift. Here drift = {stop['drift_ms']} ms, grace = "
      f"{stop['grace_ms']} ms, margin = {stop['margin_ms']} ms,")
    w(f"so the point of no return is acquire + {stop['ttl_ms'] - stop['drift_ms'] - stop['grace_ms'] - stop['margin_ms']} ms "
      f"and the deadline acquire + {stop['ttl_ms'] - stop['drift_ms']} ms.")
    w("The acquire instant is taken as the moment fencerun was started (earlier than the real request),")
    w("so the margins below are conservative. The command's death is seen through a pidfd by an observer")
    w("running at real-time priority" + ("" if stop.get("observer_realtime") else " (not granted in this run: it ran at normal priority)")
      + ". fencerun's own figure (its `command_stopped`")
    w("event) is measured on its own clock from its real acquire request.")
    w("")
    w("| command | runs | exit | dead after the point of no return (median / max) | dead before the deadline (median / min) | fencerun's own `before_deadline` |")
    w("|---|---|---|---|---|---|")
    for v in stop["variants"]:
        w(f"| {v['variant']} | {v['valid']} | {', '.join(map(str, v['exit_codes']))} | "
          f"{v['median_dead_after_pnr_ms']} / {v['max_dead_after_pnr_ms']} ms | "
          f"{v['median_before_deadline_ms']} / {v['min_before_deadline_ms']} ms | "
          f"{', '.join(str(x) for x in v['fencerun_reported'])} |")
    w("")
    w("A command that exits on TERM dies soon after the point of no return; one that ignores TERM is killed")
    w("with SIGKILL grace later, which leaves the margin before the deadline. Neither etcdctl lock nor")
    w("the script stops its command when the lease is lost, so there is nothing to compare with.")
    w("")

    # (6) RSS
    w("## 6. Memory")
    w("")
    w("Peak RSS from `/usr/bin/time -f %M` (the largest process of the tree: for the script that is")
    w("`sh` or one of its `redis-cli` children), median of the runs; and VmRSS of a process that is")
    w("waiting for a held lock.")
    w("")
    w("| tool | peak RSS, one run | fencerun's peak vs this | RSS while waiting |")
    w("|---|---|---|---|")
    frr = next((r["peak_kib_median"] for r in rss if r["tool"] == "fencerun"), None)
    for r in rss:
        cmp = "" if r["tool"] == "fencerun" else ratio(frr, r["peak_kib_median"])
        wt = "n/a" if r["waiting_rss_kib"] is None else f"{r['waiting_rss_kib'] / 1024:.1f} MiB"
        w(f"| {TOOL_LABELS[r['tool']]} | {r['peak_kib_median'] / 1024:.1f} MiB | {cmp} | {wt} |")
    w("")
    w("The script's waiting figure is its `sh` alone; it starts a `redis-cli` every 100 ms as well.")
    w("")

    # The sections other scripts write between their markers (bench/waiters.sh, bench/startup.sh,
    # bench/limit.sh) are kept as they are, in that order:
    # each starts with its begin marker (its heading comes after it).
    kept = ""
    try:
        with open(a.doc) as f:
            old = f.read()
        for tag in ("waiters", "startup", "limit"):
            begin_marker, end_marker = lib.markers(tag)
            begin, end = old.find(begin_marker), old.find(end_marker)
            if begin >= 0 and end > begin:
                kept += old[begin:end + len(end_marker)] + "\n"
    except FileNotFoundError:
        pass
    with open(a.doc, "w") as f:
        f.write("\n".join(L))
        if kept:
            f.write("\n" + kept)

    # plot
    dat = os.path.join(R, "latency.dat")
    with open(dat, "w") as f:
        f.write("# waiters " + " ".join(f"{t}_median {t}_p99" for t in tools) + "\n")
        for x in waiters:
            vals = []
            for t in tools:
                r = cell.get((t, x), {})
                vals += [str(r.get("median_ms", "NaN")), str(r.get("p99_ms", "NaN"))]
            f.write(f"{x} " + " ".join(vals) + "\n")
    colors = ["#1f77b4", "#2ca02c", "#d62728", "#ff7f0e", "#9467bd"]
    plots = []
    for i, t in enumerate(tools):
        c = colors[i % len(colors)]
        plots.append(f"'{dat}' using 1:{2 + 2 * i} with linespoints lw 2 pt 7 lc rgb '{c}' title '{TOOL_LABELS[t]} median'")
        plots.append(f"'{dat}' using 1:{3 + 2 * i} with linespoints lw 1 dt 2 pt 6 lc rgb '{c}' title '{TOOL_LABELS[t]} p99'")
    gp = "\n".join([
        f"set terminal pngcairo size 900,640 font 'sans,10'",
        f"set output '{a.plot}'",
        "set title 'Hand-over latency: previous holder's last act to next holder's first act'".replace("holder's", "holder''s"),
        "set xlabel 'waiters'",
        "set ylabel 'ms (log scale)'",
        "set logscale y",
        "set logscale x 2",
        "set xtics (" + ", ".join(f"'{x}' {x}" for x in waiters) + ")",
        "set xrange [0.8:20]",
        "set grid",
        "set key outside below center horizontal maxrows 4",
        "plot " + ", \\\n  ".join(plots),
    ])
    with open(os.path.join(R, "latency.gp"), "w") as f:
        f.write(gp + "\n")
    subprocess.run(["gnuplot", os.path.join(R, "latency.gp")], check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["latency", "throughput", "stop", "rss", "report"])
    p.add_argument("--fencerun")
    p.add_argument("--baseline", help="another fencerun binary, the tool fencerun-base")
    p.add_argument("--lock-script")
    p.add_argument("--redis-port", type=int)
    p.add_argument("--redis-pid", type=int)
    p.add_argument("--etcd-endpoint")
    p.add_argument("--work", default="/tmp")
    p.add_argument("--tools", default="fencerun,fencerun-fair,etcd,poll")
    p.add_argument("--waiters", default="1,4,16")
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--hold-ms", type=int, default=50)
    p.add_argument("--max-cell-seconds", type=float, default=30)
    p.add_argument("--contenders", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--warmup", type=float, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ttl-ms", type=int, default=2000)
    p.add_argument("--results")
    p.add_argument("--doc")
    p.add_argument("--plot")
    a = p.parse_args()
    {"latency": cmd_latency, "throughput": cmd_throughput, "stop": cmd_stop, "rss": cmd_rss,
     "report": cmd_report}[a.what](a)


if __name__ == "__main__":
    main()
