#!/usr/bin/env python3
"""Fault-injection sweep: fencerun under strace's --inject, one failing system call at a time.

One normal run under `strace -f` (per scenario, see SCENARIOS) tells which system calls fencerun's
own processes and threads make from the acquire request on (until the command's execve in the child, and after it in fencerun
itself), and how many of each: nothing is hard-coded but the error each kind of call is made to
fail with. Then, for every such call S of a kind in ERRORS and every invocation number K at which
it occurred in that window, fencerun runs again with `--inject=S:error=E:when=K` (strace counts per
thread and per call), in a private pid namespace (`unshare -pf --mount-proc`), and each run must:

  * exit with a documented code (the man page's EXIT STATUS table, or the command's own status
    when the command ran), never die by a signal of its own;
  * leave no process behind: every process fencerun's processes started (the job, its background
    grandchild, fencerun's helpers) has ended when fencerun ends (strace's timestamps, 1 s slack);
  * leave the lock released or never taken (EXISTS on the server right after the run);
  * send no signal to PID 1, to a process group or pid outside the job, or to everyone
    (kill/tkill/tgkill/pidfd_send_signal of fencerun's processes, before their execve);
  * not report the lease lost (124) in a run far shorter than its TTL.

strace injects only into calls it traces, so each run traces the injected call (and the process and
signal calls the checks read), and the matrix marks runs in which no call was failed (the run made
fewer calls of that kind than K). Invocation numbers at which the main process is still in the
dynamic loader are left out: failing those tests the loader, which cannot recover.

Prints the matrix it covered. Exit 0: all runs passed; 1: a check failed; 77: cannot run here (no
strace, no unshare, no pid namespace, no redis-server).

    sweep.py FENCERUN MANPAGE [--redis-server PATH] [--jobs N] [--max-k N] [--scenarios short,renewing] [--all]
"""
import argparse
import collections
import concurrent.futures
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# The errors a call of each kind is made to fail with, one per run. Calls of the window without an
# entry here are listed as traced, not injected (clock reads, futexes, memory advice, ...).
ERRORS = {}
for name in ("open", "openat", "openat2", "pipe", "pipe2", "eventfd", "eventfd2", "timerfd_create", "signalfd",
             "signalfd4", "pidfd_open", "pidfd_getfd", "socket", "socketpair", "dup", "dup2", "dup3",
             "epoll_create", "epoll_create1", "memfd_create", "inotify_init1", "accept4"):
    ERRORS[name] = ("EMFILE", "ENOMEM")  # descriptor exhaustion, memory
for name in ("clone", "clone3", "fork", "vfork"):
    ERRORS[name] = ("EAGAIN", "ENOMEM")  # a pids limit, RLIMIT_NPROC
ERRORS["mkdir"] = ("ENOMEM", "EACCES")
ERRORS["mmap"] = ("ENOMEM",)
ERRORS["rmdir"] = ("EBUSY",)
for name in ("prctl", "setpgid", "close_range"):
    ERRORS[name] = ("EINVAL",)
for name in ("connect", "sendto", "recvfrom", "sendmsg", "recvmsg"):
    ERRORS[name] = ("ECONNRESET",)
ERRORS["write"] = ("EIO",)
ERRORS["read"] = ("EIO",)
for name in ("poll", "ppoll"):
    ERRORS[name] = ("ENOMEM",)
ERRORS["wait4"] = ("EINTR",)
ERRORS["waitid"] = ("EINTR",)
ERRORS["timerfd_settime"] = ("EINVAL",)

# Calls that cannot fail (getpid, ...), or not in a way a program could handle, or whose failure is
# the command's (execve): never failed, also with --all.
NEVER = {"exit", "exit_group", "rt_sigreturn", "execve", "getpid", "getppid", "gettid"}

# The runs: "short" fails calls of every process and thread of fencerun's from the acquire on, in a
# job that ends at once but leaves a background grandchild for fencerun to stop; "renewing" fails the
# calls of fencerun's threads (the renewals) in a job that outlives two renewals.
SCENARIOS = {
    "short": {"ttl": "5s", "script": "sleep 4 & sleep 0.05", "threads_only": False},
    "renewing": {"ttl": "3s", "script": "sleep 2.3", "threads_only": True},
}

SIGNAL_CALLS = ("kill", "tkill", "tgkill", "pidfd_send_signal", "pidfd_open")
PROCESS_CALLS = ("clone", "clone3", "fork", "vfork", "execve", "setpgid", "exit_group")
CGROUP_CALLS = ("mkdir", "rmdir")  # the job's cgroup: made and removed by fencerun
CGROUP_MADE = re.compile(r'^mkdir\("([^"]*/fencerun-[^"/]*)", [0-7]+\)\s+=\s+0')

LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")
START = re.compile(r"^(\w+)\((.*)$")
RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
RESULT = re.compile(r"\)\s+=\s+(-?\d+)(?:\s|$)")
EXIT = re.compile(r"^\+\+\+ (exited with (\d+)|killed by (\w+)).*\+\+\+$")


class Redis:
    """Just enough RESP over a unix socket for EXISTS, DEL and PING."""

    def __init__(self, path):
        self.path = path

    def command(self, *args):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(self.path)
        out = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
        s.sendall(out)
        data = b""
        while not data.endswith(b"\r\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        s.close()
        return data.decode(errors="replace").strip()


def documented_codes(manpage):
    """The exit codes of the man page's EXIT STATUS section ("*69*::" entries)."""
    text = open(manpage, encoding="utf-8").read()
    section = text.split("== EXIT STATUS", 1)[1].split("\n== ", 1)[0]
    return {int(c) for c in re.findall(r"^\*(\d+)\*::", section, re.M)}


class Trace:
    """One strace -f -ttt output: calls per process, process tree, exits, signals sent."""

    def __init__(self, text):
        self.calls = []  # (index, pid, name, full text of the call) in order of the start lines
        self.parent = {}  # pid -> pid that created it
        self.thread = set()  # pids that are threads (CLONE_THREAD)
        self.exec_at = {}  # pid -> index of its (successful) execve start line, other than the first
        self.exit_time = {}  # pid -> timestamp of its exit
        self.exit_how = {}  # pid -> "exited with N" / "killed by SIG"
        self.main = None
        self.injected = text.count("(INJECTED)")  # calls failed by strace
        pending = {}  # pid -> (name, index, text) of an unfinished call
        for line in text.splitlines():
            m = LINE.match(line)
            if not m:
                continue
            pid, stamp, rest = int(m.group(1)), float(m.group(2)), m.group(3)
            if self.main is None:
                self.main = pid
            e = EXIT.match(rest)
            if e:
                self.exit_time[pid] = stamp
                self.exit_how[pid] = e.group(1)
                continue
            r = RESUMED.match(rest)
            if r:
                name, index, before = pending.pop(pid, (r.group(1), None, ""))
                if index is not None:
                    self.calls[index] = (self.calls[index][0], pid, name, before + r.group(2))
                    self._finished(index, pid, name, before + r.group(2))
                continue
            s = START.match(rest)
            if not s:
                continue
            name = s.group(1)
            index = len(self.calls)
            self.calls.append((index, pid, name, rest))
            if rest.endswith("<unfinished ...>"):
                pending[pid] = (name, index, rest[: -len("<unfinished ...>")])
            else:
                self._finished(index, pid, name, rest)

    def _finished(self, index, pid, name, text):
        result = RESULT.search(text)
        value = int(result.group(1)) if result else None
        if name in ("clone", "clone3", "fork", "vfork") and value and value > 0:
            self.parent[value] = pid
            if "CLONE_THREAD" in text:
                self.thread.add(value)
        if name == "execve" and value == 0 and pid != self.main:
            self.exec_at.setdefault(pid, index)

    def fencerun_call(self, index, pid):
        """Whether call `index` of `pid` is fencerun's own (not the command's, after its execve)."""
        p = pid
        while p is not None and p != self.main:
            if p in self.exec_at and (p != pid or index > self.exec_at[p]):
                return False
            p = self.parent.get(p)
        return p == self.main

    def descendants(self):
        """Every process (not thread) created below fencerun's main process."""
        return {p for p in self.parent if p not in self.thread and p != self.main}

    def window_start(self):
        """The index of the acquire request: fencerun's first write that carries EVALSHA."""
        for index, pid, name, text in self.calls:
            if name in ("sendto", "write", "sendmsg") and "EVALSHA" in text and self.fencerun_call(index, pid):
                return index
        return None

    def loader_calls(self):
        """{syscall: how many the main process made before its C library was set up (its first rseq,
        else set_robust_list)}: failing those tests the dynamic loader, not fencerun."""
        end = None
        for marker in ("rseq", "set_robust_list"):
            end = next((i for i, pid, name, _ in self.calls if pid == self.main and name == marker), None)
            if end is not None:
                break
        counts = collections.Counter()
        for index, pid, name, _ in self.calls:
            if end is None or index >= end:
                break
            if pid == self.main:
                counts[name] += 1
        return counts

    def window(self, threads_only=False):
        """{syscall: set of per-thread invocation numbers} of fencerun's calls from the acquire on (of
        its threads other than the main one only, with `threads_only`)."""
        start = self.window_start()
        seen = collections.defaultdict(collections.Counter)
        out = collections.defaultdict(set)
        for index, pid, name, _ in self.calls:
            seen[pid][name] += 1
            if threads_only and pid not in self.thread:
                continue
            if start is not None and index >= start and self.fencerun_call(index, pid):
                out[name].add(seen[pid][name])
        return out


def signals_outside_the_job(trace):
    """Signals fencerun's own processes sent anywhere but to the processes they started (the job, or
    a helper of fencerun's own before its execve), their groups, or themselves."""
    started = trace.descendants()
    ours = {trace.main} | started | trace.thread
    pidfds = {}
    bad = []
    for index, pid, name, text in trace.calls:
        if name not in SIGNAL_CALLS or not trace.fencerun_call(index, pid):
            continue
        args = text[len(name) + 1:]
        if name == "pidfd_open":
            r = RESULT.search(text)
            if r and int(r.group(1)) >= 0:
                pidfds[int(r.group(1))] = int(args.split(",")[0])
            continue
        fields = [a.strip() for a in args.split(",")]
        try:
            if name == "kill":
                target = int(fields[0])
                sig = fields[1].split(")")[0].strip()
            elif name == "tkill":
                target = int(fields[0])
                sig = fields[1].split(")")[0].strip()
            elif name == "tgkill":
                target = int(fields[0])
                sig = fields[2].split(")")[0].strip()
            else:  # pidfd_send_signal(fd, sig, info, flags)
                fd = int(fields[0])
                sig = fields[1]
                if fd not in pidfds:
                    # A pidfd from clone3(CLONE_PIDFD): its child is a process of fencerun's.
                    continue
                target = pidfds[fd]
        except (ValueError, IndexError):
            bad.append(f"{pid}: cannot read {text[:120]}")
            continue
        if target in (0, -1, 1, -1 * trace.main):
            bad.append(f"{pid}: {name} to {target} ({sig})")
        elif target < 0 and -target not in started:
            bad.append(f"{pid}: {name} to group {-target}, not the job's ({sig})")
        elif target > 0 and target not in ours:
            bad.append(f"{pid}: {name} to {target}, outside the job ({sig})")
    return bad


def self_test():
    """The checks flag what they must, on a made-up trace: a signal to PID 1, to a foreign group, to
    the caller's own group, through a pidfd of a foreign process, and a grandchild that outlived
    fencerun. Returns the problems not found (empty: all found)."""
    text = "\n".join([
        '4 1.000 execve("/f", ["f"], 0x0) = 0',
        '4 1.001 vfork( <unfinished ...>',
        '6 1.002 execve("/usr/bin/sh", ["sh"], 0x0 <unfinished ...>',
        '4 1.003 <... vfork resumed>) = 6',
        '6 1.004 <... execve resumed>) = 0',
        '6 1.005 clone(child_stack=NULL, flags=SIGCHLD) = 8',
        '4 1.006 kill(1, SIGTERM) = 0',
        '4 1.007 kill(-6, SIGTERM) = 0',
        '4 1.008 kill(-99, SIGKILL) = 0',
        '4 1.009 kill(0, SIGKILL) = 0',
        '4 1.010 pidfd_open(77, 0) = 9',
        '4 1.011 pidfd_send_signal(9, SIGKILL, NULL, 0) = 0',
        '6 1.012 +++ exited with 0 +++',
        '4 1.020 +++ exited with 0 +++',
        '8 4.000 +++ killed by SIGTERM +++',
    ])

    class Args:
        run_timeout = 20

    class NoLock:
        def command(self, *args):
            return ":0"

    problems, _, _ = check(Args(), {69, 70}, NoLock(), Trace(text), 0, "", "self-test", 0.1)
    expected = ["process 8 left behind", "kill to 1 ", "group 99", "kill to 0 ", "pidfd_send_signal to 77"]
    missing = [e for e in expected if not any(e in p for p in problems)]
    allowed = [p for p in problems if "group 6" in p]  # the job's own group is fine
    return missing + allowed


def strace_run(args, fencerun, url, name, inject, trace_path, full, scenario):
    command = ["unshare", "-pf", "--mount-proc", "strace", "-f", "-q", "-ttt", "-s", "256", "-o", trace_path]
    if not full:  # the injected call too, so that the trace shows whether the injection fired
        command += ["-e", "trace=" + ",".join(sorted(set(SIGNAL_CALLS + PROCESS_CALLS + CGROUP_CALLS +
                                                          ((inject[0],) if inject else ()))))]
    if inject:
        command += ["-e", f"inject={inject[0]}:error={inject[1]}:when={inject[2]}"]
    command += [fencerun, "-r", url, "--ttl", SCENARIOS[scenario]["ttl"], name, "--", "sh", "-c",
                SCENARIOS[scenario]["script"]]
    began = time.monotonic()
    try:
        p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=args.run_timeout)
        code, err = p.returncode, p.stderr.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        code, err = None, (e.stderr or b"").decode(errors="replace")
    took = time.monotonic() - began
    text = open(trace_path, encoding="utf-8", errors="replace").read() if os.path.exists(trace_path) else ""
    return code, err, Trace(text), took


def fencerun_exit(trace, code):
    """fencerun's own exit as strace saw it (unshare passes strace's on, which passes fencerun's)."""
    how = trace.exit_how.get(trace.main, "")
    return how or (f"exited with {code}" if code is not None else "did not end")


def check(args, codes, redis, trace, code, err, name, took, injected_call=None):
    problems = []
    how = fencerun_exit(trace, code)
    m = re.match(r"exited with (\d+)", how)
    command_ran = [p for p in trace.exec_at if trace.parent.get(p) == trace.main]
    command_codes = set()
    for p in command_ran:
        cm = re.match(r"exited with (\d+)", trace.exit_how.get(p, ""))
        if cm:
            command_codes.add(int(cm.group(1)))
        elif trace.exit_how.get(p, "").startswith("killed by"):
            command_codes.add(-1)
    command_signals = {trace.exit_how.get(p, "") for p in command_ran}
    if code is None:
        problems.append(f"did not end within {args.run_timeout}s")
    elif not m:
        # Ending by the signal that killed the command is documented (128 + N); any other is not.
        if how not in command_signals:
            problems.append(f"fencerun {how}")
    else:
        status = int(m.group(1))
        allowed = codes | command_codes | ({0} if command_ran else set())
        # A command killed by a signal of its own ends fencerun with that signal too.
        if status not in allowed and not (-1 in command_codes and status > 128):
            problems.append(f"exit {status} is not documented")
        # No lease (3 s or more) can run short in a run this short: 124 would be a false alarm.
        if status == 124 and took < 2.0:
            problems.append(f"exit 124 (lease lost) after {took:.1f}s")
    main_end = trace.exit_time.get(trace.main)
    for p in sorted(trace.descendants()):
        end = trace.exit_time.get(p)
        if main_end is not None and (end is None or end > main_end + 1.0):
            late = "never" if end is None else f"{end - main_end:.1f}s after fencerun"
            problems.append(f"process {p} left behind (ended {late})")
    if redis.command("EXISTS", f"fencerun:{{{name}}}:lock") != ":0":
        problems.append("the lock is still held after the run")
        redis.command("DEL", f"fencerun:{{{name}}}:lock")
    problems += signals_outside_the_job(trace)
    # The job's cgroup is gone when fencerun ends, unless the run failed fencerun's own rmdir of it.
    # Either way it is removed here, so that the sweep leaves nothing on the machine.
    for _, _, name, text in trace.calls:
        made = CGROUP_MADE.match(text) if name == "mkdir" else None
        if made and os.path.isdir(made.group(1)):
            if injected_call != "rmdir":
                problems.append(f"cgroup {made.group(1)} left behind")
            try:
                os.rmdir(made.group(1))
            except OSError:
                pass
    return problems, (int(m.group(1)) if m else how), bool(command_ran)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("fencerun")
    parser.add_argument("manpage")
    parser.add_argument("--redis-server", default=shutil.which("redis-server"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--max-k", type=int, default=16, help="at most this many invocation numbers per call")
    parser.add_argument("--run-timeout", type=float, default=20)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="which runs (see SCENARIOS)")
    parser.add_argument("--all", action="store_true",
                        help="also fail the calls ERRORS has no entry for, with EINVAL (futexes, clocks, ...)")
    args = parser.parse_args()

    for tool in ("strace", "unshare"):
        if not shutil.which(tool):
            print(f"SKIP: {tool} not found")
            return 77
    if not args.redis_server:
        print("SKIP: redis-server not found")
        return 77
    if subprocess.run(["unshare", "-pf", "--mount-proc", "true"], capture_output=True).returncode != 0:
        print("SKIP: cannot make a pid namespace here (unshare -pf --mount-proc)")
        return 77

    not_found = self_test()
    if not_found:
        print(f"FAIL: the checks do not flag what they must: {not_found}")
        return 1
    codes = documented_codes(args.manpage)
    work = tempfile.mkdtemp(prefix="fencerun-sweep-")
    sock = os.path.join(work, "redis.sock")
    server = subprocess.Popen([args.redis_server, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly",
                               "no", "--dir", work, "--logfile", os.path.join(work, "redis.log")])
    try:
        redis = Redis(sock)
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.command("PING") == "+PONG":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                print("FAIL: redis-server did not start")
                return 1
            time.sleep(0.02)
        url = "unix://" + sock

        # A normal run of each scenario: which calls happen, and at which invocation numbers.
        plan = []
        print(f"documented exit codes {sorted(codes)}")
        for scenario in args.scenarios.split(","):
            code, err, trace, took = strace_run(args, args.fencerun, url, f"sweep-{scenario}", None,
                                                os.path.join(work, f"{scenario}.trace"), True, scenario)
            problems, status, ran = check(args, codes, redis, trace, code, err, f"sweep-{scenario}", took)
            if problems or status != 0 or not ran:
                print(f"FAIL: the normal run ({scenario}) did not pass (exit {status}): {problems}\n{err}")
                return 1
            window = trace.window(SCENARIOS[scenario]["threads_only"])
            if not window:
                print(f"FAIL: no call found in the window of the normal run ({scenario})")
                return 1
            loader = trace.loader_calls()
            skipped = []
            for name in sorted(window):
                if name not in ERRORS and not (args.all and name not in NEVER):
                    continue
                # strace counts per thread: a K at which the main process was still in the dynamic
                # loader would fail the loader (which cannot recover) as well as the call in the window.
                ks = sorted(k for k in window[name] if k > loader[name])
                skipped += [f"{name}:{k}" for k in sorted(window[name]) if k <= loader[name]]
                if len(ks) > args.max_k:  # evenly spread, first and last included
                    step = (len(ks) - 1) / (args.max_k - 1)
                    ks = sorted({ks[round(i * step)] for i in range(args.max_k)})
                plan += [(scenario, name, error, k) for error in ERRORS.get(name, ("EINVAL",)) for k in ks]
            print(f"{scenario}: normal run {took:.2f}s under strace (--ttl {SCENARIOS[scenario]['ttl']}, "
                  f"sh -c '{SCENARIOS[scenario]['script']}')")
            if skipped:
                print("  left out, the main process's K-th call being the dynamic loader's: " + ", ".join(skipped))
            print("  calls from the acquire on, traced but not injected: " +
                  ", ".join(f"{n}x{len(window[n])}" for n in sorted(window) if n not in ERRORS))

        def one(item):
            i, (scenario, name, error, k) = item
            lock = f"sweep-{scenario}-{name}-{error}-{k}"
            return item, strace_run(args, args.fencerun, url, lock, (name, error, k),
                                    os.path.join(work, f"{i}.trace"), False, scenario), lock

        results = collections.OrderedDict()
        failures = []
        began = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for (i, (scenario, name, error, k)), (code, err, trace, took), lock in pool.map(one, enumerate(plan)):
                problems, status, ran = check(args, codes, redis, trace, code, err, lock, took, name)
                results.setdefault((scenario, name, error), []).append((k, status, ran, problems, trace.injected))
                if problems:
                    failures.append((f"{scenario} {name}", error, k, status, problems, err))
        elapsed = time.monotonic() - began

        print("\nK: exit status of the run failing the K-th call (per thread); * the command ran, "
              "~ no call failed (the run made fewer), ! a check failed")
        print(f"{'run':<10}{'syscall':<16}{'error':<12}outcomes")
        fired = 0
        for (scenario, name, error), rows in results.items():
            outcomes = " ".join(f"{k}:{status}{'*' if ran else ''}{'' if injected else '~'}{'!' if problems else ''}"
                                for k, status, ran, problems, injected in rows)
            fired += sum(1 for *_, injected in rows if injected)
            print(f"{scenario:<10}{name:<16}{error:<12}{outcomes}")
        print(f"\n{len(plan)} runs of {len(results)} calls ({fired} with a failed call) in {elapsed:.1f}s "
              f"({args.jobs} at a time); {len(failures)} failed")
        for name, error, k, status, problems, err in failures:
            print(f"FAIL {name} {error} K={k} exit {status}: " + "; ".join(problems))
            tail = err.strip().splitlines()[-3:]
            for line in tail:
                print("    " + line)
        return 1 if failures else 0
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
