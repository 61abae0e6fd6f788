#!/usr/bin/env python3
"""Checks the examples shipped in packaging/examples (installed to /usr/share/doc/fencerun/examples).

    check_examples.py yaml    EXAMPLES_DIR            every *.yml/*.yaml parses (PyYAML) and runs fencerun
    check_examples.py cron    EXAMPLES_DIR            every crontab line is well-formed and runs fencerun
    check_examples.py systemd EXAMPLES_DIR [FENCERUN] `systemd-analyze verify` accepts the units, and
                                                      they follow the rules of the man page
                                                      (exit 77: skipped, no systemd-analyze)

With FENCERUN, /usr/bin/fencerun in the units is replaced by that path first (a build tree has no
installed binary, and systemd-analyze checks that ExecStart= exists); without it the units are
verified as installed, man page reference included.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def fail(problems):
    for p in problems:
        print("  " + p, file=sys.stderr)
    sys.exit(1)


def words_of(value):
    """Every string anywhere in a parsed YAML document."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from words_of(k)
            yield from words_of(v)
    elif isinstance(value, list):
        for v in value:
            yield from words_of(v)
    elif isinstance(value, str):
        yield value


def check_yaml(d):
    try:
        import yaml
    except ImportError:
        sys.exit("python3 cannot import yaml: install python3-yaml (scripts/setup --deps-only installs it)")
    files = sorted(glob.glob(os.path.join(d, "*.yml")) + glob.glob(os.path.join(d, "*.yaml")))
    if len(files) < 3:
        fail([f"expected the GitLab CI, GitHub Actions and Kubernetes examples in {d}, found {files}"])
    problems = []
    for path in files:
        name = os.path.basename(path)
        try:
            with open(path, encoding="utf-8") as f:
                docs = [doc for doc in yaml.safe_load_all(f) if doc is not None]
        except yaml.YAMLError as e:
            problems.append(f"{name}: not valid YAML: {e}")
            continue
        strings = [s for doc in docs for s in words_of(doc)]
        # fencerun must be in the parsed data (a command or a script line), not only in a comment.
        if not any(re.search(r"(^|[\s/])fencerun(\s|$)", s) for s in strings):
            problems.append(f"{name}: no command runs fencerun")
        kinds = {doc.get("kind") for doc in docs if isinstance(doc, dict)}
        if "CronJob" in kinds:
            job = next(doc for doc in docs if isinstance(doc, dict) and doc.get("kind") == "CronJob")
            spec = job.get("spec", {})
            if spec.get("concurrencyPolicy") not in ("Forbid", "Replace", "Allow"):
                problems.append(f"{name}: CronJob without concurrencyPolicy")
            env = [e for c in spec["jobTemplate"]["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])]
            url = [e for e in env if e.get("name") == "FENCERUN_REDIS_URL"]
            if not url or "secretKeyRef" not in url[0].get("valueFrom", {}):
                problems.append(f"{name}: FENCERUN_REDIS_URL does not come from a Secret (secretKeyRef)")
        print(f"{name}: {len(docs)} YAML document(s), runs fencerun")
    if problems:
        fail(problems)


def check_cron(d):
    path = os.path.join(d, "crontab")
    problems, jobs = [], 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#") or re.match(r"^[A-Z_]+=", line):
                continue
            fields = line.split(None, 6)
            # /etc/cron.d format: five time fields, a user, the command.
            time_ok = len(fields) == 7 and all(re.fullmatch(r"[0-9*/,\-]+", x) for x in fields[:5])
            if not time_ok:
                problems.append(f"crontab:{n}: not `m h dom mon dow user command`: {line}")
            elif not re.search(r"(^|[\s;/])fencerun\s", fields[6]):
                problems.append(f"crontab:{n}: the command does not run fencerun")
            elif "%" in fields[6]:
                problems.append(f"crontab:{n}: an unescaped % ends the command in crontab(5)")
            jobs += 1
    if jobs == 0:
        problems.append("crontab: no job line")
    if problems:
        fail(problems)
    print(f"crontab: {jobs} job line(s), running fencerun")


def seconds(text):
    """A systemd time span or a fencerun duration (`60s`, `1min`, `10s`, `500ms`, `2m`) in seconds."""
    total = 0.0
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "": 1}
    for num, unit in re.findall(r"(\d+)\s*([a-z]*)", text):
        total += int(num) * units[unit]
    return total


def check_systemd(d, fencerun):
    units = sorted(glob.glob(os.path.join(d, "*.service")) + glob.glob(os.path.join(d, "*.timer")))
    services = [u for u in units if u.endswith(".service")]
    if not services or not any(u.endswith(".timer") for u in units):
        fail([f"expected a service and a timer in {d}, found {units}"])

    problems = []
    for path in services:
        name = os.path.basename(path)
        text = open(path, encoding="utf-8").read()
        settings = dict(re.findall(r"^([A-Za-z]+)=(.*)$", text, re.M))
        exec_start = settings.get("ExecStart", "")
        if "fencerun" not in exec_start:
            problems.append(f"{name}: ExecStart does not run fencerun")
        kill_mode = settings.get("KillMode")
        if kill_mode not in ("mixed", "control-group"):
            problems.append(f"{name}: KillMode={kill_mode}, expected mixed or control-group")
        if not re.search(r"^#.*KillMode", text, re.M):
            problems.append(f"{name}: no comment explains the KillMode")
        if "75" not in settings.get("SuccessExitStatus", "").split():
            problems.append(f"{name}: SuccessExitStatus does not include 75 (a busy lock)")
        grace = re.search(r"--grace[ =](\S+)", exec_start)
        grace_s = seconds(grace.group(1)) if grace else 5.0  # the default is at most 5s
        stop = settings.get("TimeoutStopSec")
        if not stop or seconds(stop) <= grace_s:
            problems.append(f"{name}: TimeoutStopSec={stop} must be longer than --grace ({grace_s:g}s)")

    analyze = shutil.which("systemd-analyze")
    if not analyze:
        if problems:
            fail(problems)
        print("SKIPPED: systemd-analyze is not installed (package systemd); the units' settings were checked")
        sys.exit(SKIP)

    with tempfile.TemporaryDirectory() as tmp:
        copies = []
        for path in units:
            text = open(path, encoding="utf-8").read()
            if fencerun:
                text = text.replace("/usr/bin/fencerun", os.path.abspath(fencerun))
            copy = os.path.join(tmp, os.path.basename(path))
            with open(copy, "w", encoding="utf-8") as f:
                f.write(text)
            copies.append(copy)
        cmd = [analyze, "verify"] + (["--man=no"] if fencerun else []) + copies
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        out = (r.stdout + r.stderr).strip()
        print("$ systemd-analyze verify " + " ".join(os.path.basename(c) for c in copies))
        if out:
            print(out)
        if r.returncode != 0:
            problems.append(f"systemd-analyze verify exited {r.returncode}")
        # Warnings about the units themselves (not about the machine) count as failures too.
        for line in out.splitlines():
            if any(os.path.basename(u) in line for u in units):
                problems.append("systemd-analyze: " + line)
    if problems:
        fail(problems)
    print(f"{len(units)} units verified")


def main():
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in ("yaml", "cron", "systemd"):
        sys.exit(__doc__)
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "yaml":
        check_yaml(d)
    elif mode == "cron":
        check_cron(d)
    else:
        check_systemd(d, sys.argv[3] if len(sys.argv) == 4 else None)


if __name__ == "__main__":
    main()
