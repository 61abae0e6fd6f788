#!/usr/bin/env python3
"""fencerun break at a real terminal (a pseudo-terminal): it asks before breaking a lease; n keeps
the lock (exit 1, "not broken"), y breaks it (exit 0) and the holder stops with 124.

    break_tty_test.py FENCERUN

Starts its own redis-server on a free loopback port. Exit 0: passed; 1: failed; 77: skipped.
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
        self.dir = tempfile.mkdtemp(prefix="fencerun-admin-tty.")
        for _ in range(20):
            self.port = free_port()
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self.cli("PING") == "PONG":
                    return
                time.sleep(0.02)
            self.proc.kill()
            self.proc.wait()
        sys.exit("redis-server did not start")

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=10)
        return r.stdout.strip()

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Terminal:
    """A program on the slave side of a new pseudo-terminal."""

    def __init__(self, argv, env):
        try:
            self.pid, self.fd = pty.fork()
        except OSError as e:
            print("SKIPPED: cannot open a pseudo-terminal:", e)
            sys.exit(SKIP)
        if self.pid == 0:
            os.execvpe(argv[0], argv, env)
        self.out = b""
        self.status = None

    def read(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 4096)
        except OSError:
            return False
        self.out += data
        return bool(data)

    def expect(self, pattern, timeout=10):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if re.search(pattern, self.text()):
                return True
            self.read(0.05)
        return bool(re.search(pattern, self.text()))

    def send(self, data):
        os.write(self.fd, data)

    def wait(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self.read(0.05):
                    pass
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            self.read(0.05)
        return None

    def kill(self):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass

    def text(self):
        return self.out.decode(errors="replace")


failures = []


def check(ok, why, term=None):
    if not ok:
        failures.append(why + ("\n--- terminal output ---\n" + term.text() if term else ""))
    return ok


def ask(fencerun, url, env, answer):
    term = Terminal([fencerun, "break", "-r", url, "job"], env)
    try:
        if not check(term.expect(r"break job, held by .*\? \[y/N\] ", 10), "no question on the terminal", term):
            return term, None
        term.send(answer)
        return term, term.wait(10)
    finally:
        term.kill()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    fencerun = sys.argv[1]
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        print("SKIPPED: needs redis-server and redis-cli")
        sys.exit(SKIP)
    redis = Redis()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCERUN_", "REDIS"))}
    env["TERM"] = "dumb"
    url = "redis://127.0.0.1:%d" % redis.port
    work = tempfile.mkdtemp(prefix="fencerun-admin-tty-work.")
    holder = None
    try:
        holder = subprocess.Popen(
            [fencerun, "run", "-r", url, "--ttl", "3s", "job", "--", "sh", "-c",
             "echo $$ > pid; while [ ! -e go ]; do sleep 0.02; done"],
            cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and redis.cli("EXISTS", "fencerun:{job}:lock") != "1":
            time.sleep(0.02)
        value = redis.cli("GET", "fencerun:{job}:lock")
        if not check(value != "", "the holder never took the lock"):
            return

        term, code = ask(fencerun, url, env, b"n\r")
        check(code == 1, "answer n: exit %r, expected 1" % code, term)
        check("fencerun: not broken" in term.text(), "answer n: no 'fencerun: not broken'", term)
        check(redis.cli("GET", "fencerun:{job}:lock") == value, "answer n: the lock changed", term)
        check(holder.poll() is None, "answer n: the holder ended", term)

        term, code = ask(fencerun, url, env, b"\r")
        check(code == 1, "empty answer: exit %r, expected 1" % code, term)
        check(redis.cli("GET", "fencerun:{job}:lock") == value, "empty answer: the lock changed", term)

        term, code = ask(fencerun, url, env, b"y\r")
        check(code == 0, "answer y: exit %r, expected 0" % code, term)
        check(re.search(r"broke job: pid %d on " % holder.pid, term.text()) is not None,
              "answer y: no 'broke job: pid %d on ...'" % holder.pid, term)
        check(redis.cli("EXISTS", "fencerun:{job}:lock") == "0", "answer y: the lock is still there", term)
        try:
            rc = holder.wait(10)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 124, "the broken holder exited with %r, expected 124" % rc)
    finally:
        if holder and holder.poll() is None:
            open(os.path.join(work, "go"), "w").close()
            try:
                holder.wait(10)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        for f in failures:
            print("FAILED:", f)
        sys.exit(1)
    print("passed: break asks on a terminal")


if __name__ == "__main__":
    main()
