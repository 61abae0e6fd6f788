#!/usr/bin/env python3
"""fencerun at a real terminal (a pseudo-terminal): Ctrl-C, pipelines and Ctrl-Z behave as they do
without fencerun.

    tty_test.py SCENARIO FENCERUN

Scenarios: ctrl_c_stops_the_calling_script, pipeline_reader_keeps_the_terminal,
command_reads_the_terminal, ctrl_z_stops_the_job_and_fg_resumes_it,
ctrl_z_longer_than_the_lease_ends_the_job, ctrl_z_past_the_lease_ends_what_left_the_group.
With FENCERUN_CGROUP=off in the environment, fencerun holds the job without a cgroup.
Each starts its own redis-server on a free loopback port. Exit 0: passed; 77: skipped.
"""
import os
import pty
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77


def free_port():
    for _ in range(100):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    sys.exit("no free port")


class Redis:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="fencerun-tty.")
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.cli("PING") == "PONG":
                return
            time.sleep(0.02)
        sys.exit("redis-server did not answer")

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=10)
        return r.stdout.strip()

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Terminal:
    """A program on the slave side of a new pseudo-terminal, as its session leader."""

    def __init__(self, argv, env):
        try:
            self.pid, self.fd = pty.fork()
        except OSError as e:  # no /dev/pts (a bare chroot)
            print("SKIPPED: cannot open a pseudo-terminal:", e)
            sys.exit(SKIP)
        if self.pid == 0:
            os.execvpe(argv[0], argv, env)
        self.out = b""
        self.status = None

    def read(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            r, _, _ = select.select([self.fd], [], [], max(0.0, end - time.monotonic()))
            if not r:
                break
            try:
                data = os.read(self.fd, 4096)
            except OSError:
                return False
            if not data:
                return False
            self.out += data
            return True
        return False

    def expect(self, pattern, timeout=10):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if re.search(pattern, self.out.decode(errors="replace")):
                return True
            self.read(min(0.1, max(0.0, end - time.monotonic())))
            if self.exited():
                return bool(re.search(pattern, self.out.decode(errors="replace")))
        return bool(re.search(pattern, self.out.decode(errors="replace")))

    def send(self, data):
        os.write(self.fd, data)

    def exited(self):
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
                while self.read(0.05):
                    pass
        return self.status is not None

    def wait(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.exited():
            self.read(0.05)
        return self.status

    def kill(self):
        if not self.exited():
            os.killpg(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)

    def text(self):
        return self.out.decode(errors="replace")


def fail(term, why):
    print("FAILED:", why)
    print("--- terminal output ---")
    print(term.text())
    term.kill()
    sys.exit(1)


def lock_gone(redis, name, timeout=5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if redis.cli("EXISTS", "fencerun:{%s}:lock" % name) == "0":
            return True
        time.sleep(0.02)
    return False


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    scenario, fencerun = sys.argv[1:]
    if not shutil.which("redis-server") or not shutil.which("bash"):
        print("SKIPPED: needs redis-server and bash")
        sys.exit(SKIP)
    redis = Redis()
    env = {k: v for k, v in os.environ.items()
           if k == "FENCERUN_CGROUP" or not k.startswith(("FENCERUN_", "REDIS"))}
    env.update({"TERM": "dumb", "PS1": "$ ", "FR": fencerun, "URL": "redis://127.0.0.1:%d" % redis.port})
    try:
        globals()[scenario](redis, env)
    finally:
        redis.stop()
    print("passed:", scenario)


def ctrl_c_stops_the_calling_script(redis, env):
    # Without fencerun, Ctrl-C in `step1; step2` ends the script: the shell sees the interrupt.
    term = Terminal(["bash", "-c", '"$FR" -r "$URL" ttyc -- sh -c "echo started; exec sleep 100"; echo step2; exit 5'],
                    env)
    if not term.expect(r"(^|\n)started"):
        fail(term, "the command did not start")
    time.sleep(0.2)
    term.send(b"\x03")
    status = term.wait(10)
    if status is None:
        fail(term, "the script did not end after Ctrl-C")
    if "step2" in term.text():
        fail(term, "the script went on after Ctrl-C (step2 ran)")
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT):
        fail(term, "the script did not end by SIGINT (status %r)" % status)
    if not lock_gone(redis, "ttyc"):
        fail(term, "the lock was left held")


def pipeline_reader_keeps_the_terminal(redis, env):
    # A reader of the terminal later in the same pipeline must not be stopped by SIGTTIN.
    term = Terminal(["bash", "-c",
                     '"$FR" -r "$URL" ttyp -- sh -c "echo hello; sleep 2" | '
                     '{ read -r first; read -r line < /dev/tty; echo "got:$first:$line"; cat > /dev/null; }'], env)
    time.sleep(0.7)
    term.send(b"abc\n")
    if not term.expect(r"got:hello:abc", 10):
        fail(term, "the pipeline's reader did not get the terminal's line")
    status = term.wait(10)
    if status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        fail(term, "the pipeline did not end well (status %r)" % status)


def command_reads_the_terminal(redis, env):
    # Reading the terminal, and a shell with job control, inside the command work as without fencerun.
    term = Terminal(["bash", "-c", '"$FR" -r "$URL" ttyr -- sh -c \'read -r x; echo "read:$x"; '
                     'bash -m -c "sleep 0.1 & wait; echo jobs-ok"\''], env)
    time.sleep(0.5)
    term.send(b"hello\n")
    if not term.expect(r"read:hello", 10):
        fail(term, "the command could not read the terminal")
    if not term.expect(r"jobs-ok", 10):
        fail(term, "bash -m inside the command did not work")
    status = term.wait(10)
    if status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        fail(term, "the run did not end well (status %r)" % status)


def interactive(env):
    return Terminal(["bash", "--norc", "--noprofile", "-i"], env)


def suspended_job(env, ttl, name, before=""):
    """An interactive shell whose foreground job, fencerun running a loop, was just stopped by Ctrl-Z."""
    term = interactive(env)
    term.expect(r"\$ ", 5)
    term.send(('"$FR" -r "$URL" --ttl %s %s -- sh -c "%secho started; while :; do sleep 0.1; done"\n'
               % (ttl, name, before)).encode())
    if not term.expect(r"(^|\n)started"):
        fail(term, "the command did not start")
    term.send(b"\x1a")
    if not term.expect(r"Stopped", 5):
        fail(term, "Ctrl-Z did not give the prompt back")
    return term


def ctrl_z_stops_the_job_and_fg_resumes_it(redis, env):
    term = suspended_job(env, "3s", "ttyz")
    # Stopped by TSTP, as flock(1) or any other process at Ctrl-Z: 128 + 20.
    term.send(b"echo st=$?\n")
    if not term.expect(r"st=148", 5):
        fail(term, "the stopped job's status is not 148 (128 + SIGTSTP)")
    term.send(b"fg\n")
    time.sleep(1)
    if redis.cli("EXISTS", "fencerun:{ttyz}:lock") != "1":
        fail(term, "the lock is not held after fg")
    term.send(b"\x03")
    term.send(b"echo rc=$?\n")
    if not term.expect(r"rc=130", 10):
        fail(term, "Ctrl-C after fg did not end the job with 130")
    if not lock_gone(redis, "ttyz"):
        fail(term, "the lock was left held")
    term.send(b"exit\n")
    term.wait(5)
    term.kill()


def fg_gives_lease_lost(term):
    """`fg` of a job the watchdog ended while it was stopped: fencerun exits 124."""
    term.send(b"fg\n")
    term.send(b"echo rc=$?\n")
    if not term.expect(r"rc=124", 10):
        fail(term, "a job stopped past its lease was not ended with 124")
    term.send(b"exit\n")
    term.wait(5)
    term.kill()


def ctrl_z_longer_than_the_lease_ends_the_job(redis, env):
    term = suspended_job(env, "1s", "ttyl")
    time.sleep(2.5)  # longer than the lease: the watchdog ends the job meanwhile
    fg_gives_lease_lost(term)


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def ctrl_z_past_the_lease_ends_what_left_the_group(redis, env):
    # While fencerun is stopped with its job, the watchdog alone ends the job at the lease's stop
    # point: a process that left the job's process group (setsid) included.
    pidfile = os.path.join(redis.dir, "daemon.pid")
    term = suspended_job(env, "1s", "ttyd", "setsid sleep 100 & echo \\$! > %s; " % pidfile)
    try:
        with open(pidfile) as f:
            daemon = int(f.read())
    except (OSError, ValueError):
        fail(term, "the command did not write its daemon's pid")
    if not pid_alive(daemon):
        fail(term, "the daemon was not running while the job was stopped")
    end = time.monotonic() + 5
    while pid_alive(daemon) and time.monotonic() < end:
        time.sleep(0.05)
    if pid_alive(daemon):
        fail(term, "a process that left the group ran on past the lease")
    fg_gives_lease_lost(term)


if __name__ == "__main__":
    main()
