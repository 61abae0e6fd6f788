#!/usr/bin/env python3
"""Cost of one hand-over as the number of waiters grows (bench/waiters.sh runs it; standard library only).

    waiters.py sweep  --tools T,.. --waiters 1,16,.. --results DIR ...   one JSON file per cell in DIR
    waiters.py report --results DIR --doc docs/benchmarks.md --plot docs/waiters.png

A cell is one tool and one number of waiters W on a fresh lock name. A holder takes the lock with a
command that blocks until "go"; after it holds, the counters are read, W waiters are started and
awaited until every one of them is really waiting, then "go"; once all W have run their command and
exited, the counters are read again. So the window holds W hand-overs and each waiter's arrival
(first busy try, subscribe, queueing) as well as its turn and its release.

Tools: fencerun, fencerun-fair, etcd (etcdctl lock), flock (flock(1)).
"""
import argparse
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from handover import env_for_tools, read_stamps  # noqa: E402  (shared with bench/handover.sh's runs)
import lib  # noqa: E402  (the section of docs/benchmarks.md: lib.splice)
import urllib.request

TOOL_LABELS = {
    "fencerun": "fencerun",
    "fencerun-fair": "fencerun --fair",
    "etcd": "etcdctl lock",
    "flock": "flock(1)",
}
# Memory one waiting process takes, MiB, used to skip a cell that would not fit (MemAvailable) until a
# cell of that tool with 16 or more waiters has measured it (MemAvailable before and while they wait).
RSS_GUESS_MIB = {"fencerun": 8, "fencerun-fair": 8, "etcd": 32, "flock": 2}
# Threads of one waiting process, likewise (they take pids: kernel.pid_max bounds them all).
THREADS_GUESS = {"fencerun": 4, "fencerun-fair": 4, "etcd": 12, "flock": 1}

CHILDREN = []  # every process started, for the clean-up


def say(*args):
    print("waiters.py:", *args, file=sys.stderr, flush=True)


def spawn(argv, pidfile, **kw):
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)
    CHILDREN.append(p)
    if pidfile:
        with open(pidfile, "a") as f:
            f.write(f"{p.pid}\n")
    return p


def kill_all(procs, grace=3.0):
    live = [p for p in procs if p.poll() is None]
    for p in live:
        try:
            p.terminate()
        except ProcessLookupError:
            pass
    end = time.monotonic() + grace
    for p in live:
        try:
            p.wait(max(0.05, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in live:
        if p.poll() is None:
            try:
                p.kill()
            except ProcessLookupError:
                pass
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass


def on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# --- small clients -----------------------------------------------------------------------------------

class Redis:
    """A minimal RESP client on one connection; counts the commands it sends."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.file = self.sock.makefile("rb")
        self.sent = 0
        self.local_port = self.sock.getsockname()[1]

    def __call__(self, *args):
        out = [f"*{len(args)}\r\n".encode()]
        for x in args:
            b = x if isinstance(x, bytes) else str(x).encode()
            out.append(f"${len(b)}\r\n".encode() + b + b"\r\n")
        self.sock.sendall(b"".join(out))
        self.sent += 1
        return self._read()

    def _read(self):
        line = self.file.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError("redis: " + rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)[:-2]
            return data.decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RuntimeError(f"redis: unexpected reply {line!r}")

    def info(self):
        d = {}
        for line in self("INFO").splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                d[k] = v
        return d

    def close(self):
        self.sock.close()


class Etcd:
    """etcd's /metrics and its JSON gateway (one Range per count)."""

    def __init__(self, endpoint):
        self.endpoint = endpoint.rstrip("/")
        self.ranges = 0

    def metrics(self):
        text = urllib.request.urlopen(self.endpoint + "/metrics", timeout=10).read().decode()
        m = {"handled": {}, "started": {}, "msg_received": {}}
        for line in text.splitlines():
            for key, prefix in (("handled", "grpc_server_handled_total{"), ("started", "grpc_server_started_total{"),
                                ("msg_received", "grpc_server_msg_received_total{")):
                if line.startswith(prefix):
                    labels, value = line.rsplit(" ", 1)
                    method = labels.split('grpc_method="', 1)[1].split('"', 1)[0]
                    m[key][method] = m[key].get(method, 0) + int(float(value))
        return m

    def count_prefix(self, prefix):
        import base64
        end = bytearray(prefix.encode())
        end[-1] += 1
        body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                           "range_end": base64.b64encode(bytes(end)).decode(), "count_only": True}).encode()
        req = urllib.request.Request(self.endpoint + "/v3/kv/range", data=body,
                                     headers={"Content-Type": "application/json"})
        self.ranges += 1
        r = json.loads(urllib.request.urlopen(req, timeout=10).read().decode())
        return int(r.get("count", 0))


def metrics_delta(before, after):
    out = {}
    for key in after:
        d = {}
        for method, v in after[key].items():
            x = v - before.get(key, {}).get(method, 0)
            if x:
                d[method] = x
        out[key] = d
    return out


# --- /proc -----------------------------------------------------------------------------------------

HZ = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid):
    """utime + stime of a process (all its threads), in ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000.0 / HZ


def cpu_ns_schedstat(pid):
    """Time on a CPU of all threads of a process, in ns (/proc/PID/task/*/schedstat; finer than ticks)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass  # a thread that ended in between: its time is lost to this figure
    except FileNotFoundError:
        return None
    return total


def proc_status(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


def rss_kib(pid):
    return proc_status(pid, "VmRSS")


def free_pids():
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    with open("/proc/loadavg") as f:
        tasks = int(f.read().split()[3].split("/")[1])
    return pid_max - tasks


def tcp_established(port):
    """ESTABLISHED TCP connections whose local port is `port` (server side of each client connection)."""
    n = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "01" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        n += 1
        except FileNotFoundError:
            pass
    return n


def blocked_flocks(path):
    """Processes blocked in flock(2) on `path`, from /proc/locks ("->" lines)."""
    st = os.stat(path)
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    n = 0
    with open("/proc/locks") as f:
        for line in f:
            if "->" in line and line.split()[-3] == ident:
                n += 1
    return n


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def settle(limit):
    """Waits (up to `limit` seconds) until the 1-minute load average is below the number of CPUs, so a
    cell does not start in the wake of the one before it (a thousand processes exiting). Returns the
    seconds waited."""
    began = time.monotonic()
    cpus = os.cpu_count() or 1
    while loadavg()[0] >= cpus and time.monotonic() - began < limit:
        time.sleep(2)
    return round(time.monotonic() - began, 1)


def mem_available_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def percentile(values, p):
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def wait_until(pred, timeout, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


# --- one cell --------------------------------------------------------------------------------------

def tool_argv(a, tool, name, lockfile, command, holder=False):
    if tool in ("fencerun", "fencerun-fair"):
        argv = [a.fencerun, "-r", f"redis://127.0.0.1:{a.redis_port}"]
        if not holder:
            argv += ["--wait", a.wait]
        if tool == "fencerun-fair":
            argv.append("--fair")
        return argv + [name, "--"] + command
    if tool == "etcd":
        # Timeouts and session TTL well above their defaults (2 s dial, 5 s command, 10 s session): with
        # hundreds of Go processes starting on 2 CPUs, the defaults make waiters give up before go.
        return ["etcdctl", f"--endpoints={a.etcd_endpoint}", "--dial-timeout=60s", "--command-timeout=120s",
                "lock", "--ttl=120", name, "--"] + command
    if tool == "flock":
        argv = ["flock"]
        if not holder:
            argv += ["-w", str(parse_seconds(a.wait))]
        return argv + [lockfile] + command
    raise SystemExit(f"unknown tool {tool}")


def parse_seconds(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", s)
    if not m:
        raise SystemExit(f"bad duration {s}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[m.group(2)]


class Monitor:
    """`redis-cli MONITOR` into a file; the window is cut by two ECHO markers sent on our connection."""

    def __init__(self, a, path):
        self.path = path
        self.out = open(path, "wb")
        self.p = spawn(["redis-cli", "-p", str(a.redis_port), "MONITOR"], a.pidfile, stdout=self.out,
                       stderr=subprocess.DEVNULL)
        if not wait_until(lambda: os.path.getsize(path) > 0, 10):
            raise RuntimeError("MONITOR did not attach")

    def wait_for(self, marker, timeout=60):
        needle = marker.encode()

        def seen():
            with open(self.path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.path) - 65536))
                return needle in f.read()
        return wait_until(seen, timeout, 0.1)

    def stop(self):
        kill_all([self.p])
        self.out.close()


LINE_RE = re.compile(r'^\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]*)"')


def count_monitor(path, begin, end, own_port):
    """Client requests between the markers: lines of clients other than ours, `lua` lines left out."""
    inside = False
    n_clients = n_lua = n_own = 0
    names = {}
    own = f"127.0.0.1:{own_port}"
    with open(path, errors="replace") as f:
        for line in f:
            if not inside:
                if begin in line:
                    inside = True
                continue
            if end in line:
                break
            m = LINE_RE.match(line)
            if not m:
                continue
            src, cmd = m.group(1), m.group(2).lower()
            if src == "lua":
                n_lua += 1
            elif src == own:
                n_own += 1
            else:
                n_clients += 1
                names[cmd] = names.get(cmd, 0) + 1
    return {"client": n_clients, "lua": n_lua, "own": n_own, "by_command": dict(sorted(names.items(), key=lambda kv: -kv[1])),
            "complete": inside}


def run_cell(a, tool, W, seq):
    name = f"bw-{tool}-{W}-{os.getpid()}-{seq}"
    d = os.path.join(a.work, name)
    os.makedirs(d)
    acq, rel, held, go = (os.path.join(d, x) for x in ("acq", "rel", "held", "go"))
    os.mkfifo(go)
    lockfile = os.path.join(d, "flock")
    open(lockfile, "w").close()
    errlog = open(os.path.join(d, "stderr"), "ab")
    env = env_for_tools()
    r = {"tool": tool, "waiters": W, "name": name, "status": "ok", "problems": [],
         "load_start": loadavg(), "time_start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    redis_tool = tool.startswith("fencerun")
    procs = []
    mon = rc = et = None
    t_cell = time.monotonic()
    try:
        if redis_tool:
            rc = Redis(a.redis_port)
            mon = Monitor(a, os.path.join(d, "monitor"))
        elif tool == "etcd":
            et = Etcd(a.etcd_endpoint)

        # The holder: says it holds, blocks until "go" is written to the FIFO, writes its release stamp.
        holder_cmd = ["sh", "-c", f'echo > {held}; read x < {go}; date +%s%N >> {rel}']
        holder = spawn(tool_argv(a, tool, name, lockfile, holder_cmd, holder=True), a.pidfile, env=env,
                       stdout=subprocess.DEVNULL, stderr=errlog)
        procs.append(holder)
        if not wait_until(lambda: os.path.exists(held) or holder.poll() is not None, 30):
            raise RuntimeError("the holder did not get the lock in 30 s")
        if holder.poll() is not None:
            raise RuntimeError(f"the holder exited with {holder.returncode}")
        time.sleep(0.3)  # let the holder's start settle (its first requests are not in the window)

        # --- counters before -----------------------------------------------------------------------
        begin, end = f"waiters-begin-{name}", f"waiters-end-{name}"
        if redis_tool:
            rc("ECHO", begin)
            info0 = rc.info()
            sent0 = rc.sent  # the INFO just sent is counted in the next INFO's figure
            server_pid = a.redis_pid
        elif tool == "etcd":
            m0 = et.metrics()
            ranges0 = et.ranges
            conns0 = tcp_established(a.etcd_port)
            server_pid = a.etcd_pid
        else:
            server_pid = None
        cpu0 = cpu_ms(server_pid) if server_pid else None
        mem0 = mem_available_mib()
        sched0 = cpu_ns_schedstat(server_pid) if server_pid else None
        if redis_tool:
            clients0 = int(info0["connected_clients"])

        # --- the waiters -----------------------------------------------------------------------------
        waiter_cmd = ["sh", "-c", f"date +%s%N >> {acq}; date +%s%N >> {rel}"]
        t0 = time.monotonic()
        waiters = []
        def memory_check():
            if mem_available_mib() < a.min_free_mib:
                raise RuntimeError(f"memory ran short (MemAvailable under {a.min_free_mib} MiB) with "
                                   f"{len(waiters)} waiters started: stopped them")
        for i in range(W):
            if i % 50 == 49:
                memory_check()
            p = spawn(tool_argv(a, tool, name, lockfile, waiter_cmd), a.pidfile, env=env,
                      stdout=subprocess.DEVNULL, stderr=errlog)
            waiters.append(p)
            procs.append(p)
        r["spawn_seconds"] = round(time.monotonic() - t0, 2)

        def waiting_count():
            if redis_tool:
                chans = rc("PUBSUB", "CHANNELS", f"{a.key_prefix}{{{name}}}:*") or []
                if not chans:
                    return 0
                reply = rc("PUBSUB", "NUMSUB", *chans)
                return sum(int(reply[i + 1]) for i in range(0, len(reply), 2))
            if tool == "etcd":
                return et.count_prefix(name + "/") - 1
            return blocked_flocks(lockfile)

        deadline = a.settle_seconds + W * a.settle_per_waiter
        n_waiting, early = 0, []
        end_wait = time.monotonic() + deadline
        while time.monotonic() < end_wait:
            n_waiting = waiting_count()
            early = [p for p in waiters if p.poll() is not None]
            if n_waiting >= W or early:
                break
            memory_check()
            time.sleep(0.1 if W < 200 else 0.25)
        r["arrival_seconds"] = round(time.monotonic() - t0, 2)
        r["waiting_seen"] = n_waiting
        if early:
            raise RuntimeError(f"{len(early)} waiter(s) exited before go (exit {early[0].returncode})")
        if n_waiting < W:
            raise RuntimeError(f"only {n_waiting} of {W} waiters were waiting after {deadline:.0f} s")

        # --- while all W wait: connections, RSS ------------------------------------------------------
        if redis_tool:
            clients1 = int(rc("INFO", "clients").split("connected_clients:", 1)[1].split()[0])
            r["connections_per_waiter"] = round((clients1 - clients0) / W, 3)
        elif tool == "etcd":
            r["connections_per_waiter"] = round((tcp_established(a.etcd_port) - conns0) / W, 3)
        rss = [x for x in (rss_kib(p.pid) for p in waiters) if x]
        r["rss_per_waiter_kib"] = round(sum(rss) / len(rss)) if rss else None
        threads = [x for x in (proc_status(p.pid, "Threads") for p in waiters) if x]
        r["threads_per_waiter"] = round(sum(threads) / len(threads), 1) if threads else None
        r["mem_available_mib_waiting"] = mem_available_mib()
        # What W waiting processes take from the machine (shared pages such as the binary's count once).
        r["mem_per_waiter_mib"] = round(max(0, mem0 - r["mem_available_mib_waiting"]) / W, 2)

        # --- go --------------------------------------------------------------------------------------
        t_go = time.monotonic()
        fd = None
        while fd is None:
            try:
                fd = os.open(go, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                if holder.poll() is not None or time.monotonic() - t_go > 10:
                    raise RuntimeError("the holder is not reading its go FIFO")
                time.sleep(0.01)
        os.write(fd, b"go\n")
        os.close(fd)
        limit = parse_seconds(a.wait) + 30
        end_run = time.monotonic() + limit
        for p in procs:
            try:
                p.wait(max(0.01, end_run - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        stuck = [p for p in procs if p.poll() is None]
        r["run_seconds"] = round(time.monotonic() - t_go, 2)
        if stuck:
            r["status"] = "timeout"
            r["problems"].append(f"{len(stuck)} process(es) still running {limit:.0f} s after go: killed")
            kill_all(stuck)
        codes = {}
        for p in waiters:
            codes[p.returncode] = codes.get(p.returncode, 0) + 1
        r["waiter_exit_codes"] = {str(k): v for k, v in codes.items()}
        r["holder_exit_code"] = holder.returncode
        failed = sum(v for k, v in codes.items() if k != 0)
        if failed and r["status"] == "ok":
            r["status"] = "failed"
        if failed:
            r["problems"].append(f"{failed} waiter(s) did not exit 0: {r['waiter_exit_codes']}")
        if holder.returncode != 0:
            r["status"] = "failed" if r["status"] == "ok" else r["status"]
            r["problems"].append(f"the holder exited with {holder.returncode}")

        # --- counters after --------------------------------------------------------------------------
        cpu1 = cpu_ms(server_pid) if server_pid else None
        sched1 = cpu_ns_schedstat(server_pid) if server_pid else None
        if redis_tool:
            own = rc.sent - sent0 + 1  # ours since the first INFO, that INFO included, this one not
            info1 = rc.info()
            rc("ECHO", end)
            total = int(info1["total_commands_processed"]) - int(info0["total_commands_processed"]) - own
            r["own_commands"] = own
            r["commands_total"] = total
            r["commands_per_handover"] = round(total / W, 2)
            if not mon.wait_for(end):
                r["problems"].append("MONITOR did not show the end marker")
            mon.stop()
            c = count_monitor(mon.path, begin, end, rc.local_port)
            r["monitor"] = c
            r["client_requests_per_handover"] = round(c["client"] / W, 2)
            r["lua_per_handover"] = round(c["lua"] / W, 2)
            if not c["complete"]:
                r["problems"].append("MONITOR output lacks the begin marker")
            r["redis_cpu_ms_info"] = round((float(info1["used_cpu_sys"]) + float(info1["used_cpu_user"])
                                            - float(info0["used_cpu_sys"]) - float(info0["used_cpu_user"])) * 1000, 1)
        elif tool == "etcd":
            time.sleep(0.2)
            m1 = et.metrics()
            delta = metrics_delta(m0, m1)
            own = et.ranges - ranges0
            r["own_ranges"] = own
            handled = sum(delta["handled"].values())
            if delta["handled"].get("Range", 0) >= own:
                handled -= own
                delta["handled"]["Range"] = delta["handled"].get("Range", 0) - own
                for key in ("started", "msg_received"):
                    if delta[key].get("Range", 0) >= own:
                        delta[key]["Range"] -= own
            r["grpc"] = delta
            r["grpc_handled_total"] = handled
            r["grpc_per_handover"] = round(handled / W, 2)
            r["grpc_msg_received_per_handover"] = round(sum(delta["msg_received"].values()) / W, 2)
        if server_pid:
            r["server_cpu_ms"] = round(cpu1 - cpu0, 1)
            r["server_cpu_ms_per_handover"] = round((cpu1 - cpu0) / W, 3)
            r["server_cpu_tick_ms"] = 1000.0 / HZ
            if sched0 is not None and sched1 is not None:
                r["server_cpu_ms_schedstat"] = round((sched1 - sched0) / 1e6, 1)
                r["server_cpu_ms_per_handover_schedstat"] = round((sched1 - sched0) / 1e6 / W, 3)

        # --- hand-overs from the stamps ------------------------------------------------------------
        acqs, rels = read_stamps(acq), read_stamps(rel)
        r["acq_stamps"], r["rel_stamps"] = len(acqs), len(rels)
        # Sections in order: the holder's (its release stamp only), then one per waiter (acq, rel).
        gaps, overlaps = [], 0
        for i, t in enumerate(acqs):
            if i < len(rels) and t < rels[i]:
                overlaps += 1
            if i + 1 < len(rels) and t > rels[i + 1]:
                overlaps += 1
            if i < len(rels):
                gaps.append(t - rels[i])
        r["overlaps"] = overlaps
        if overlaps:
            r["status"] = "overlap"
            r["problems"].append(f"{overlaps} critical section(s) overlapped")
        if len(acqs) != W or len(rels) != W + 1:
            r["problems"].append(f"{len(acqs)} acquire and {len(rels)} release stamps for {W} waiters")
        if gaps:
            ms = [g / 1e6 for g in gaps]
            r["handovers_measured"] = len(ms)
            r["median_ms"] = round(statistics.median(ms), 2)
            r["p99_ms"] = round(percentile(ms, 99), 2)
            r["max_ms"] = round(max(ms), 2)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # a failed cell is reported as such, and the sweep goes on
        r["status"] = "failed"
        r["problems"].append(str(e))
    finally:
        kill_all(procs)
        if mon:
            mon.stop()
        if rc:
            rc.close()
        errlog.close()
    try:
        with open(os.path.join(d, "stderr"), errors="replace") as f:
            err = f.read().strip()
        if err:
            r["stderr_tail"] = err[-600:]
    except FileNotFoundError:
        pass
    r["load_end"] = loadavg()
    r["seconds"] = round(time.monotonic() - t_cell, 1)
    return r


def run_repeated(a, tool, W, seq, n):
    """A cell of one hand-over, run `n` times: the per-hand-over figures are the means of the runs, the
    latency median and p99 those of the n hand-overs. The first run that fails is the result."""
    runs = []
    for k in range(n):
        r = run_cell(a, tool, W, seq * 1000 + k)
        if r.get("status") != "ok":
            return r
        runs.append(r)
    merged = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("waiters",):
            values = [x[key] for x in runs if isinstance(x.get(key), (int, float))]
            merged[key] = round(sum(values) / len(values), 3)
    singles = [x["median_ms"] for x in runs if x.get("median_ms") is not None]
    if singles:
        merged["median_ms"] = round(statistics.median(singles), 2)
        merged["p99_ms"] = round(sorted(singles)[max(0, math.ceil(0.99 * len(singles)) - 1)], 2)
    merged["repeats"] = n
    merged["load_end"] = runs[-1].get("load_end")
    merged["overlaps"] = sum(x.get("overlaps", 0) for x in runs)
    return merged


def cmd_sweep(a):
    signal.signal(signal.SIGTERM, on_signal)
    os.makedirs(a.results, exist_ok=True)
    mem_seen, threads_seen = {}, {}
    with open("/proc/meminfo") as f:
        total_mib = int(f.readline().split()[1]) // 1024
    headroom = max(2048, total_mib // 10)
    seq = 0
    cells = [(tool, int(W)) for tool in a.tools.split(",") for W in a.waiters.split(",")]
    try:
        for tool, W in cells:
                seq += 1
                path = os.path.join(a.results, f"cell-{tool}-{W}.json")
                per = mem_seen.get(tool, RSS_GUESS_MIB[tool])
                need, avail = W * per * 1.5 + headroom, mem_available_mib()
                tper = max(THREADS_GUESS[tool], threads_seen.get(tool, 0))
                tneed, tfree = W * tper * 1.3 + 500, free_pids()
                why = []
                if need > avail:
                    why.append(f"would need about {need:.0f} MiB ({per:.1f} MiB per waiter, x1.5, + {headroom} MiB "
                               f"headroom), {avail} MiB available")
                if tneed > tfree:
                    why.append(f"would need about {tneed:.0f} pids ({tper:.0f} threads per waiter), {tfree} free")
                if why:
                    r = {"tool": tool, "waiters": W, "status": "skipped", "problems": why,
                         "load_start": loadavg(), "load_end": loadavg()}
                else:
                    settled = settle(a.settle)
                    say(f"{TOOL_LABELS[tool]:16} W={W:<5} ...")
                    if W == 1:
                        r = run_repeated(a, tool, W, seq, a.single_repeats)
                    else:
                        r = run_cell(a, tool, W, seq)
                    r["settle_seconds"] = settled
                    if W >= 16 and r.get("mem_per_waiter_mib"):
                        # at least 1 MiB, and never below what a larger cell measured
                        mem_seen[tool] = max(1.0, r["mem_per_waiter_mib"], mem_seen.get(tool, 0))
                    if r.get("threads_per_waiter"):
                        threads_seen[tool] = max(threads_seen.get(tool, 0), r["threads_per_waiter"])
                with open(path, "w") as f:
                    json.dump(r, f, indent=1)
                say(f"{TOOL_LABELS[tool]:16} W={W:<5} {r['status']}: "
                    + ", ".join(f"{k}={r[k]}" for k in ("commands_per_handover", "client_requests_per_handover",
                                                          "grpc_per_handover", "median_ms", "p99_ms",
                                                          "server_cpu_ms_per_handover", "connections_per_waiter",
                                                          "seconds") if k in r)
                    + (f" ({'; '.join(r['problems'])})" if r.get("problems") else ""))
    finally:
        kill_all(CHILDREN)


# --- report ----------------------------------------------------------------------------------------

def fmt(x, digits=1):
    if x is None:
        return "n/a"
    if isinstance(x, float) and x >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}f}"


def load_cells(results):
    cells = []
    for fn in sorted(os.listdir(results)):
        if fn.startswith("cell-") and fn.endswith(".json"):
            with open(os.path.join(results, fn)) as f:
                cells.append(json.load(f))
    order = list(TOOL_LABELS)
    cells.sort(key=lambda c: (order.index(c["tool"]) if c["tool"] in order else 99, c["waiters"]))
    return cells


def scaling_summary(cells):
    """One sentence per tool: commands per hand-over at the largest W against the smallest W > 1, and
    the median hand-over at the largest W (and at 500) against W = 1."""
    out = []
    tools = []
    for c in cells:
        if c["tool"] not in tools:
            tools.append(c["tool"])
    for t in tools:
        ok = sorted((c for c in cells if c["tool"] == t and c.get("status") == "ok"), key=lambda c: c["waiters"])
        if len(ok) < 2:
            continue
        parts = []
        key = "commands_per_handover" if t.startswith("fencerun") else "grpc_per_handover" if t == "etcd" else None
        many = [c for c in ok if c["waiters"] > 1 and c.get(key) is not None] if key else []
        if len(many) >= 2:
            lo, hi = many[0], many[-1]
            unit = "commands" if key == "commands_per_handover" else "gRPC calls"
            parts.append(f"{hi[key]:.1f} {unit} per hand-over at W = {hi['waiters']}, "
                         f"{hi[key] / lo[key]:.2f}x the {lo[key]:.1f} at W = {lo['waiters']}")
        one = next((c for c in ok if c["waiters"] == 1 and c.get("median_ms")), None)
        if one:
            for c in ok:
                if c["waiters"] in (500, ok[-1]["waiters"]) and c["waiters"] > 1 and c.get("median_ms"):
                    parts.append(f"median hand-over at W = {c['waiters']} {c['median_ms'] / one['median_ms']:.2f}x "
                                 f"that at W = 1 ({c['median_ms']:.1f} vs {one['median_ms']:.1f} ms)")
        if parts:
            out.append(f"{TOOL_LABELS.get(t, t)}: " + "; ".join(parts) + ".")
    return out


def section(cells, meta, plot_name):
    nproc = int(meta.get("nproc", os.cpu_count() or 1))
    L = []
    w = L.append
    w("## 7. Many waiters: cost per hand-over")
    w("")
    w("What one hand-over costs as the number of waiters W grows. For each tool and W, on a fresh lock")
    w("name: a holder takes the lock with a command that blocks until it is told to go; the counters are")
    w(f"read; W waiters are started, each `TOOL --wait {meta.get('wait', '120s')} NAME -- sh -c 'date +%s%N >>acq; date +%s%N >>rel'`")
    w("(etcdctl: `etcdctl lock NAME -- ...`; flock: `flock -w SECONDS FILE ...`), and awaited until every")
    w("one is really waiting (fencerun: the subscribers of `fencerun:{NAME}:*` add up to W; etcd: W+1 keys")
    w("under `NAME/`; flock: W blocked entries in /proc/locks); then go; once all W have exited the")
    w("counters are read again. The window thus holds W hand-overs and each waiter's arrival (its first")
    w("busy try, its subscription, its place in a queue) as well as its turn and its release (W acquires,")
    w("W+1 releases: the holder's too); every figure is that window's total divided by W. A cell of W = 1")
    w("holds a single hand-over, so it is run 15 times: its figures are the means of those runs, and its")
    w("latency median and p99 those of the 15 hand-overs.")
    w("")
    w("- **commands**: Redis `INFO stats` total_commands_processed, which counts the commands that")
    w("  scripts run inside the server too; the benchmark's own commands (INFO, PUBSUB, ECHO) are left out.")
    w("  For etcd: gRPC calls handled (grpc_server_handled_total from /metrics, every method; a stream counts")
    w("  once), the benchmark's own Range calls left out.")
    w("- **requests**: lines of `redis-cli MONITOR` over the same window whose source is a client, so")
    w("  without the `lua` ones (script-internal) and without the benchmark's connection. For etcd: gRPC")
    w("  messages received (lease keep-alives on a stream count each).")
    w("- **hand-over**: all acquire and release stamps sorted; a hand-over is an acquire stamp minus the")
    w("  release stamp before it (the holder's release stamp is its last act). It includes a waiter waking,")
    w("  its acquire, and the start of its `sh` and `date`. Overlaps count critical sections that began")
    w("  before the previous one ended (must be 0).")
    w("- **server CPU**: utime+stime of redis-server (or etcd) from /proc/PID/stat over the window, ± one")
    w("  clock tick over W; in brackets the same from /proc/PID/task/*/schedstat (ns resolution). For Redis")
    w("  it includes feeding the one MONITOR client.")
    w("- **conns**: (connected clients while all W wait − before the waiters) / W (etcd: ESTABLISHED TCP")
    w("  connections to its client port); **RSS**: mean VmRSS of one waiting process, and in brackets")
    w("  (W ≥ 16) the drop of MemAvailable per waiter while all wait (shared pages counted once; the")
    w("  machine's other work moves it too). A cell that would not fit in MemAvailable is skipped.")
    w("")
    if meta:
        w("Made with")
        w("")
        w("```")
        w(meta.get("command", "bench/waiters.sh"))
        w("```")
        w("")
        w(f"on {meta.get('date', '?')}, {meta.get('nproc', '?')} CPUs ({meta.get('cpu', '?')}), "
          f"{meta.get('mem', '?')}, Linux {meta.get('kernel', '?')}; load average {meta.get('load_start', '?')} "
          f"at the start and {meta.get('load_end', '?')} at the end; {meta.get('fencerun_version', '?')} "
          f"({meta.get('revision', '?')}, binary {meta.get('binary', '?')}); {meta.get('redis_version', '?')} "
          f"(`--save '' --appendonly no`, maxclients {meta.get('maxclients', '?')}); {meta.get('etcd_version', '?')} "
          f"(data on {meta.get('etcd_data', '?')}); {meta.get('flock_version', '?')}. The run took "
          f"{meta.get('seconds', '?')} s.")
        w("")
    if meta.get("smoke"):
        w(f"**Smoke run ({meta['smoke']}): not the figures of the full sweep.**")
        w("")
    w(f"**A figure taken while the load average was above the number of CPUs ({nproc}) is not a figure:**")
    w("such cells are marked ⚠. The load column is the 1-minute average at the cell's start → end; before each")
    w("cell the sweep waits (up to 300 s) for it to fall below the CPUs, and the end figure includes the")
    w("cell's own W processes (starting W waiters is itself load: each is a process).")
    w("")
    w("| tool | W | status | commands / hand-over | requests / hand-over | hand-over median / p99 | overlaps | server CPU / hand-over | conns / waiter | RSS / waiter | load |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        t = c["tool"]
        status = c.get("status", "?")
        if c.get("problems") and status != "skipped":
            status += ": " + "; ".join(c["problems"])[:160]
        elif status == "skipped":
            status += ": " + "; ".join(c.get("problems", []))
        if t.startswith("fencerun"):
            cmds, reqs = fmt(c.get("commands_per_handover")), fmt(c.get("client_requests_per_handover"))
        elif t == "etcd":
            cmds = fmt(c.get("grpc_per_handover")) + (" gRPC" if "grpc_per_handover" in c else "")
            reqs = fmt(c.get("grpc_msg_received_per_handover")) + (" msgs" if "grpc_msg_received_per_handover" in c else "")
        else:
            cmds = reqs = "— (no server)"
        lat = (f"{fmt(c['median_ms'], 2)} / {fmt(c['p99_ms'], 2)} ms" if "median_ms" in c else "n/a")
        if "server_cpu_ms_per_handover" in c:
            cpu = f"{fmt(c['server_cpu_ms_per_handover'], 2)} ms ±{fmt(c.get('server_cpu_tick_ms', 10) / c['waiters'], 2)}"
            if "server_cpu_ms_per_handover_schedstat" in c:
                cpu += f" ({fmt(c['server_cpu_ms_per_handover_schedstat'], 2)})"
        else:
            cpu = "—" if t == "flock" else "n/a"
        conns = fmt(c.get("connections_per_waiter"), 2) if t != "flock" else "—"
        rss = f"{c['rss_per_waiter_kib'] / 1024:.1f} MiB" if c.get("rss_per_waiter_kib") else "n/a"
        if c.get("mem_per_waiter_mib") is not None and c["waiters"] >= 16:
            rss += f" ({c['mem_per_waiter_mib']:.1f})"
        l0, l1 = (c.get("load_start") or [0])[0], (c.get("load_end") or [0])[0]
        load = f"{l0:.1f} → {l1:.1f}" + (" ⚠" if l0 > nproc and status != "skipped" else "")
        ov = str(c.get("overlaps", "n/a"))
        w(f"| {TOOL_LABELS.get(t, t)} | {c['waiters']} | {status} | {cmds} | {reqs} | {lat} | {ov} | {cpu} | {conns} | {rss} | {load} |")
    w("")
    summary = scaling_summary(cells)
    if summary:
        w("How each tool scales, from the cells above that completed (smallest W with more than one")
        w("hand-over against the largest; latency against W = 1):")
        w("")
        for line in summary:
            w(f"- {line}")
        w("")
    w(f"![commands per hand-over and median hand-over latency by number of waiters]({plot_name})")
    w("")
    w("Raw results (one JSON file per cell, with the commands seen by MONITOR by name and etcd's gRPC")
    w("calls by method): the results directory that bench/waiters.sh prints; `bench/waiters.py report")
    w("--results DIR` writes this section and the plot again from it.")
    return "\n".join(L)


def placeholder():
    return "\n".join([
        "## 7. Many waiters: cost per hand-over",
        "",
        "Commands (and requests), server CPU, connections and hand-over latency per hand-over for",
        "W = 1, 16, 100, 500 and 1000 waiters, fencerun (with and without `--fair`), `etcdctl lock`",
        "and flock(1). No figures yet: run bench/waiters.sh (it writes this section and docs/waiters.png).",
    ])


def replace_section(doc, body):
    lib.splice(doc, "waiters", lib.block("waiters", body))


def plot(cells, results, out, meta):
    tools = [t for t in TOOL_LABELS if any(c["tool"] == t for c in cells)]
    Ws = sorted({c["waiters"] for c in cells})
    cell = {(c["tool"], c["waiters"]): c for c in cells}

    def val(t, W, key):
        c = cell.get((t, W))
        if not c or c.get("status") not in ("ok",) or c.get(key) is None:
            return "NaN"
        return str(c[key])

    dat = os.path.join(results, "waiters.dat")
    cols = []
    for t in tools:
        if t.startswith("fencerun"):
            cols += [(t, "commands_per_handover", f"{TOOL_LABELS[t]}: commands (scripts included)", 1),
                     (t, "client_requests_per_handover", f"{TOOL_LABELS[t]}: client requests", 2)]
        elif t == "etcd":
            cols += [(t, "grpc_per_handover", "etcdctl lock: gRPC calls", 1)]
    lat_cols = [(t, "median_ms", TOOL_LABELS[t]) for t in tools]
    with open(dat, "w") as f:
        f.write("# W " + " ".join(f"{t}:{k}" for t, k, *_ in cols + lat_cols) + "\n")
        for W in Ws:
            f.write(f"{W} " + " ".join(val(t, W, k) for t, k, *_ in cols + lat_cols) + "\n")
    colors = {"fencerun": "#1f77b4", "fencerun-fair": "#2ca02c", "etcd": "#d62728", "flock": "#ff7f0e"}
    points = {"fencerun": 7, "fencerun-fair": 5, "etcd": 9, "flock": 13}
    def has_data(t, k):
        return any(val(t, W, k) != "NaN" for W in Ws)

    left = [f"'{dat}' using 1:{2 + i} with linespoints lw 2 pt {points[t]} ps 1.3 dt {dt} lc rgb '{colors[t]}' title '{title}'"
            for i, (t, k, title, dt) in enumerate(cols) if has_data(t, k)]
    right = [f"'{dat}' using 1:{2 + len(cols) + i} with linespoints lw 2 pt {points[t]} ps 1.3 lc rgb '{colors[t]}' title '{title}'"
             for i, (t, k, title) in enumerate(lat_cols) if has_data(t, k)]
    title = (f"bench/waiters.sh, {meta.get('date', '?')}, load {meta.get('load_start', '?')} → {meta.get('load_end', '?')}"
             f" on {meta.get('nproc', '?')} CPUs" + (" (smoke run)" if meta.get("smoke") else "")).replace('"', "'")
    def empty(curves):
        return [] if curves else ["set yrange [1:100]", "set label 1 'no cell completed' at graph 0.5, 0.5 center"]

    xr = f"[{Ws[0] * 0.7}:{Ws[-1] * 1.4}]" if Ws else "[*:*]"
    gp = "\n".join([
        "set terminal pngcairo size 1200,560 font 'sans,10'",
        f"set output '{out}'",
        "set datafile missing 'NaN'",
        f"set multiplot layout 1,2 title \"{title}\"",
        "set logscale x 10",
        "set logscale y 10",
        f"set xrange {xr}",
        "set xtics (" + ", ".join(f"'{W}' {W}" for W in Ws) + ")",
        "set grid",
        "set key top left",
        "set xlabel 'waiters W'",
        "set title 'Commands (Redis) or gRPC calls (etcd) per hand-over'",
        "set ylabel 'per hand-over (log scale)'",
        *empty(left),
        "plot " + (", \\\n  ".join(left) if left else "1/0 notitle"),
        "unset label 1",
        "set autoscale y",
        "set title 'Median hand-over latency'",
        "set ylabel 'ms (log scale)'",
        *empty(right),
        "plot " + (", \\\n  ".join(right) if right else "1/0 notitle"),
        "unset multiplot",
    ])
    gpf = os.path.join(results, "waiters.gp")
    with open(gpf, "w") as f:
        f.write(gp + "\n")
    subprocess.run(["gnuplot", gpf], check=True)


def cmd_report(a):
    if a.placeholder:
        replace_section(a.doc, placeholder())
        return
    cells = load_cells(a.results)
    if not cells:
        raise SystemExit(f"no cell-*.json in {a.results}")
    meta = {}
    mp = os.path.join(a.results, "meta.json")
    if os.path.exists(mp):
        with open(mp) as f:
            meta = json.load(f)
    replace_section(a.doc, section(cells, meta, os.path.relpath(a.plot, os.path.dirname(os.path.abspath(a.doc)))))
    plot(cells, a.results, a.plot, meta)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["sweep", "report"])
    p.add_argument("--fencerun")
    p.add_argument("--redis-port", type=int)
    p.add_argument("--redis-pid", type=int)
    p.add_argument("--etcd-endpoint")
    p.add_argument("--etcd-port", type=int)
    p.add_argument("--etcd-pid", type=int)
    p.add_argument("--key-prefix", default="fencerun:")
    p.add_argument("--work", default="/tmp")
    p.add_argument("--pidfile", help="append the pid of every process started here to this file")
    p.add_argument("--tools", default="fencerun,fencerun-fair,flock,etcd")
    p.add_argument("--waiters", default="1,16,100,500,1000")
    p.add_argument("--wait", default="120s", help="each waiter's --wait")
    p.add_argument("--settle-seconds", type=float, default=30, help="time for all waiters to be waiting: this ...")
    p.add_argument("--settle-per-waiter", type=float, default=0.2, help="... plus this per waiter")
    p.add_argument("--single-repeats", type=int, default=15,
                   help="a cell of W = 1 (one hand-over) is run this many times")
    p.add_argument("--settle", type=float, default=300,
                   help="before a cell, wait up to this many seconds for the load average to fall below the CPUs")
    p.add_argument("--min-free-mib", type=int, default=1024,
                   help="stop a cell whose waiters bring MemAvailable under this")
    p.add_argument("--results")
    p.add_argument("--doc")
    p.add_argument("--plot")
    p.add_argument("--placeholder", action="store_true", help="report: write the placeholder section only")
    a = p.parse_args()
    {"sweep": cmd_sweep, "report": cmd_report}[a.what](a)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        say(f"interrupted ({e}): every process started here was stopped")
        sys.exit(130)
