#!/usr/bin/env python3
"""Parses a fencerun --metrics-file with the Prometheus client library's text-format parser and
checks it.

    check_metrics.py FILE LOCK [EXPECTATION...]

An EXPECTATION is METRIC=VALUE, METRIC>=VALUE or METRIC<=VALUE, with METRIC the name without the
`fencerun_last_` prefix (e.g. exit_code=75, renewals>=1). Every file is also checked for the
complete set of metrics, their type, the lock label, and consistent timestamps.
Prints what is wrong and exits 1; exits 2 when the parser itself is missing.
"""
import sys
import time

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("python3 cannot import prometheus_client: install python3-prometheus-client "
          "(scripts/setup --deps-only installs it)", file=sys.stderr)
    sys.exit(2)

PREFIX = "fencerun_last_"
NAMES = ["start_timestamp_seconds", "end_timestamp_seconds", "duration_seconds", "lock_wait_seconds",
         "acquired", "exit_code", "token", "renewals", "renew_failures", "lease_lost"]
# Written when the run knows of a successful run of the lock (the server's record of runs).
OPTIONAL = ["success_timestamp_seconds"]
INTEGRAL = {"acquired", "exit_code", "token", "renewals", "renew_failures", "lease_lost"}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, lock, expectations = sys.argv[1], sys.argv[2], sys.argv[3:]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    problems = []
    values = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and friends on malformed input
        print(f"{path} is not valid Prometheus text format: {e}\n--- file ---\n{text}", file=sys.stderr)
        sys.exit(1)

    seen = [f.name for f in families]
    expected = [PREFIX + n for n in NAMES]
    if sorted(n for n in seen if n[len(PREFIX):] not in OPTIONAL) != sorted(expected):
        problems.append(f"metric families {seen}, expected {expected}")
    for fam in families:
        if fam.type != "gauge":
            problems.append(f"{fam.name}: type {fam.type}, expected gauge")
        if not fam.documentation:
            problems.append(f"{fam.name}: no HELP text")
        if len(fam.samples) != 1:
            problems.append(f"{fam.name}: {len(fam.samples)} samples, expected 1")
            continue
        s = fam.samples[0]
        if s.name != fam.name:
            problems.append(f"{fam.name}: sample named {s.name}")
        if s.labels != {"lock": lock}:
            problems.append(f"{fam.name}: labels {s.labels}, expected {{'lock': {lock!r}}}")
        short = fam.name[len(PREFIX):]
        if short in INTEGRAL and s.value != int(s.value):
            problems.append(f"{fam.name}: {s.value} is not an integer")
        values[short] = s.value

    if "success_timestamp_seconds" in values and not (0 < values["success_timestamp_seconds"] <= time.time() + 5):
        problems.append(f"last success {values['success_timestamp_seconds']} is not a recent Unix time")
    if len([n for n in values if n not in OPTIONAL]) == len(NAMES):
        start, end = values["start_timestamp_seconds"], values["end_timestamp_seconds"]
        now = time.time()
        if not (now - 600 <= start <= end <= now + 5):
            problems.append(f"timestamps out of order or not recent: start {start}, end {end}, now {now}")
        if abs((end - start) - values["duration_seconds"]) > 0.0025:
            problems.append(f"duration {values['duration_seconds']} is not end - start = {end - start}")
        if not (0 <= values["lock_wait_seconds"] <= values["duration_seconds"] + 0.0015):
            problems.append(f"lock wait {values['lock_wait_seconds']} outside 0..duration")
        if values["acquired"] not in (0, 1) or values["lease_lost"] not in (0, 1):
            problems.append("acquired and lease_lost must be 0 or 1")
        if values["acquired"] == 0 and values["token"] != 0:
            problems.append(f"token {values['token']} without acquiring the lock")

    for e in expectations:
        for op in (">=", "<=", "="):
            if op in e:
                name, want = e.split(op, 1)
                break
        else:
            sys.exit(f"bad expectation {e!r}")
        if name not in values:
            problems.append(f"{PREFIX}{name} is missing (expected {op}{want})")
            continue
        got, want = values[name], float(want)
        ok = got == want if op == "=" else got >= want if op == ">=" else got <= want
        if not ok:
            problems.append(f"{PREFIX}{name} is {got:g}, expected {op} {want:g}")

    if problems:
        print(f"{path}:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        print("--- file ---\n" + text, file=sys.stderr)
        sys.exit(1)
    print(f"{path}: {len(families)} metrics for lock {lock!r} parsed and checked")


if __name__ == "__main__":
    main()
