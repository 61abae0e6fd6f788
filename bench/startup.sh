#!/usr/bin/env bash
# fencerun's own cost per run, next to flock(1) and bare /bin/true, in one run on loopback:
#   1. `fencerun -r redis://127.0.0.1:PORT NAME -- true` against `flock FILE true`, `true`, and, when
#      installed, `etcdctl lock NAME -- true` and the redis-cli script bench/redis-lock.sh;
#   2. start-up alone: `fencerun --version`, `--help` and a usage error against `true`;
# each with the hyperfine mean (`hyperfine -N -w 5 -r 60`, every command of a table in the same
# hyperfine run), page faults per run (`perf stat -e page-faults`, which counts every process of the
# run, when perf works; else minor + major faults of the whole process tree from getrusage, with the
# runner as subreaper so that orphans such as fencerun's watchdog are counted too) and peak RSS
# (ru_maxrss of the run, through /usr/bin/time -f %M when installed). The load average is recorded before and after, and nothing is measured
# while it is above the number of CPUs (it waits for it to settle, up to LOAD_WAIT seconds).
# Writes the section between <!-- startup:begin --> and <!-- startup:end --> of docs/benchmarks.md
# (appended at the end the first time; bench/handover.py and bench/waiters.py keep it).
#
#   cmake -S . -B build -G Ninja && cmake --build build && bench/startup.sh
#
# Environment:
#   FENCERUN=path    binary to measure (default: build/src/fencerun in this checkout)
#   BASELINE=path    another fencerun binary (an older build) measured in the same hyperfine runs
#   BASELINE_NAME=s  what to call it in the tables (default: "baseline build"), e.g. its commit
#   BENCH_DOC=path   where to write the section (default: docs/benchmarks.md); BENCH_DOC=- prints only
#   RUNS=60 WARMUP=5 FAULT_RUNS=30 LOAD_WAIT=600
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fencerun="$(realpath "${FENCERUN:-$repo/build/src/fencerun}")"
baseline="${BASELINE:+$(realpath "$BASELINE")}"
doc="${BENCH_DOC:-$repo/docs/benchmarks.md}"
runs="${RUNS:-60}"
warmup="${WARMUP:-5}"
fault_runs="${FAULT_RUNS:-30}"
load_wait="${LOAD_WAIT:-600}"
command_line="bench/startup.sh"
for v in FENCERUN BASELINE BASELINE_NAME RUNS WARMUP FAULT_RUNS; do [[ -n "${!v:-}" ]] && command_line="$v=${!v} $command_line"; done

say() { echo "startup.sh: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"
[[ -z "$baseline" || -x "$baseline" ]] || die "BASELINE=$BASELINE is not an executable"
need redis-server redis-server
need redis-cli redis-tools
need flock util-linux
need hyperfine hyperfine
need python3 python3
install_missing

work="$(mktemp -d "${TMPDIR:-/tmp}/fencerun-startup.XXXXXX")"
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
start_redis
url="redis://127.0.0.1:$redis_port"

endpoint=""
if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
  endpoint="http://127.0.0.1:$(free_port)"
  peer_port="$(free_port)"
  start_etcd startup
fi

# label<TAB>command<TAB>expected exit code, one per line; every command is checked once first.
{
  printf 'true\ttrue\t0\n'
  printf 'flock FILE true\tflock %s true\t0\n' "$work/flock"
  printf 'fencerun\t%s -r %s bench-startup -- true\t0\n' "$fencerun" "$url"
  [[ -n "$baseline" ]] && printf 'fencerun (BASELINE)\t%s -r %s bench-startup-base -- true\t0\n' "$baseline" "$url"
  [[ -n "$endpoint" ]] && printf 'etcdctl lock\tetcdctl --endpoints=%s lock bench-startup -- true\t0\n' "$endpoint"
  command -v redis-cli >/dev/null && printf 'redis-cli script\t%s %s bench-startup-sh 10000 0 true\t0\n' \
    "$repo/bench/redis-lock.sh" "$redis_port"
} >"$work/locks.tsv"
{
  printf 'true\ttrue\t0\n'
  printf 'true --version\ttrue --version\t0\n'
  printf 'fencerun --version\t%s --version\t0\n' "$fencerun"
  printf 'fencerun --help\t%s --help\t0\n' "$fencerun"
  printf 'fencerun usage error\t%s --no-such-option\t64\n' "$fencerun"
  if [[ -n "$baseline" ]]; then
    printf 'fencerun --version (BASELINE)\t%s --version\t0\n' "$baseline"
    printf 'fencerun --help (BASELINE)\t%s --help\t0\n' "$baseline"
    printf 'fencerun usage error (BASELINE)\t%s --no-such-option\t64\n' "$baseline"
  fi
} >"$work/startup.tsv"

ETCD_NOTE="$etcd_data_note" bench_python - "$work" "$doc" "$command_line" "$fencerun" "$baseline" "$runs" "$warmup" "$fault_runs" "$load_wait" <<'PY'
import ctypes, os, resource, shlex, subprocess, sys, time
from lib import hyperfine_results, splice

work, doc, command_line, fencerun, baseline = sys.argv[1:6]
runs, warmup, fault_runs, load_wait = (int(x) for x in sys.argv[6:10])
ncpu = os.cpu_count() or 1

def say(*a):
    print("startup.sh:", *a, file=sys.stderr, flush=True)

def load1():
    return os.getloadavg()[0]

def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()

def settle():
    """Waits until the 1-minute load is below the number of CPUs; returns it (and whether it settled)."""
    deadline = time.monotonic() + load_wait
    while load1() >= ncpu and time.monotonic() < deadline:
        say(f"load {load1():.2f} >= {ncpu} CPUs: waiting for it to settle")
        time.sleep(10)
    return load1(), load1() < ncpu

def read_table(name):
    rows = []
    with open(os.path.join(work, name)) as f:
        for line in f:
            label, cmd, rc = line.rstrip("\n").split("\t")
            rows.append({"label": label, "cmd": cmd, "rc": int(rc)})
    return rows

def check(rows):
    for r in rows:
        p = subprocess.run(shlex.split(r["cmd"]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != r["rc"]:
            raise SystemExit(f"startup.sh: `{r['cmd']}` exited {p.returncode}, not {r['rc']}: {p.stderr.strip()}")

def hyperfine(rows, name):
    out = os.path.join(work, name + ".json")
    argv = ["hyperfine", "-N", "-w", str(warmup), "-r", str(runs), "--export-json", out, "--style", "basic"]
    if any(r["rc"] != 0 for r in rows):
        argv.append("-i")  # a usage error exits 64 by design (checked above)
    argv += [r["cmd"] for r in rows]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    for r, h in zip(rows, hyperfine_results(out)):
        r["mean_ms"] = h["mean"] * 1000
        r["stddev_ms"] = h["stddev"] * 1000
        r["median_ms"] = h["median"] * 1000

def interleaved(rows):
    """Wall time of every command, run in turn (one run of each, then the next round): load that comes
    and goes on a shared machine then falls on every command alike. Records the median of `runs` rounds."""
    null = os.open(os.devnull, os.O_RDWR)
    argvs = [shlex.split(r["cmd"]) for r in rows]
    times = [[] for _ in rows]
    for i in range(warmup + runs):
        for k, argv in enumerate(argvs):
            t = time.perf_counter()
            pid = os.posix_spawnp(argv[0], argv, os.environ,
                                  file_actions=[(os.POSIX_SPAWN_DUP2, null, 1), (os.POSIX_SPAWN_DUP2, null, 2)])
            os.waitpid(pid, 0)
            if i >= warmup:
                times[k].append((time.perf_counter() - t) * 1000)
    os.close(null)
    for r, t in zip(rows, times):
        r["interleaved_median_ms"] = median(t)

def perf_works():
    try:
        p = subprocess.run(["perf", "stat", "-x,", "-e", "page-faults", "true"], capture_output=True, text=True)
    except FileNotFoundError:
        return False
    return p.returncode == 0 and any(l.split(",")[0].strip().isdigit() for l in p.stderr.splitlines())

def perf_faults(cmd):
    p = subprocess.run(["perf", "stat", "-x,", "-r", str(fault_runs), "-e", "page-faults", "--"] + shlex.split(cmd),
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in p.stderr.splitlines():
        f = line.split(",")
        if len(f) > 2 and "page-faults" in line:
            return float(f[0])
    return None

# The runner becomes a subreaper: a process of the run that outlives its parent (fencerun's watchdog)
# comes back here, is reaped here, and so is counted in RUSAGE_CHILDREN.
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_CHILD_SUBREAPER = 36
libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None

def peak_rss_kib(cmd):
    """Peak RSS of one run (ru_maxrss, KiB). Through GNU time when there is one: a child started from
    this Python process would be charged Python's own RSS from before its exec."""
    if TIME:
        out = os.path.join(work, "maxrss")
        subprocess.run([TIME, "-f", "%M", "-o", out] + shlex.split(cmd), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        with open(out) as f:
            return float(f.read().split()[-1])
    with open(os.devnull, "wb") as null:
        p = subprocess.Popen(shlex.split(cmd), stdout=null, stderr=null)
        _, _, ru = os.wait4(p.pid, 0)
        p.returncode = 0
    return float(ru.ru_maxrss)

def rusage_run(cmd):
    """Page faults of every process of one run, and the run's peak RSS in KiB."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.devnull, "wb") as null:
        p = subprocess.Popen(shlex.split(cmd), stdout=null, stderr=null)
        os.wait4(p.pid, 0)
        p.returncode = 0  # reaped here: keep Popen from waiting again
    end = time.monotonic() + 2
    while time.monotonic() < end:  # the orphans (the watchdog exits right after the command)
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.001)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    faults = (after.ru_minflt - before.ru_minflt) + (after.ru_majflt - before.ru_majflt)
    return faults, peak_rss_kib(cmd)

def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2

use_perf = perf_works()

def faults_and_rss(rows):
    for r in rows:
        samples = [rusage_run(r["cmd"]) for _ in range(fault_runs)]
        r["faults_rusage"] = median([s[0] for s in samples])
        r["rss_kib"] = median([s[1] for s in samples])
        r["faults_perf"] = perf_faults(r["cmd"]) if use_perf else None

def measure(name):
    rows = read_table(name + ".tsv")
    check(rows)
    load_before, settled = settle()
    up_before = uptime()
    hyperfine(rows, name)
    interleaved(rows)
    faults_and_rss(rows)
    up_after = uptime()
    return {"rows": rows, "load_before": load_before, "settled": settled, "uptime_before": up_before,
            "uptime_after": up_after, "load_after": load1()}

def version(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True).stdout.splitlines()[0].strip()
    except Exception:
        return "unknown"

say("measuring the locked runs")
locks = measure("locks")
say("measuring start-up alone")
startup = measure("startup")

def ref(rows, label):
    return next(r for r in rows if r["label"] == label)

def fmt_ms(r):
    return f"{r['mean_ms']:.2f} ± {r['stddev_ms']:.2f} ms"

def faults_cell(r):
    if r["faults_perf"] is not None:
        return f"{r['faults_perf']:.0f}"
    return f"{r['faults_rusage']:.0f}"

def label(r):
    return r["label"].replace("(BASELINE)", "(" + (os.environ.get("BASELINE_NAME") or "baseline build") + ")")

def load_note(m):
    warn = "" if m["settled"] and m["load_after"] < ncpu else " ⚠ (above the CPU count: not a figure)"
    return f"load {m['load_before']:.2f} → {m['load_after']:.2f}{warn}"

cpu = "unknown"
try:
    with open("/proc/cpuinfo") as f:
        cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
except Exception:
    pass
revision = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(doc)) if doc != "-" else ".", "describe",
                           "--always", "--dirty"], capture_output=True, text=True).stdout.strip() or "unknown"
L = []
w = L.append
w("<!-- startup:begin -->")
w("## 8. Cost of one run: start-up, page faults, peak RSS")
w("")
w("fencerun wraps short cron jobs, so what it costs per run counts. `fencerun -r redis://127.0.0.1:PORT NAME")
w("-- true` (free lock: connect, acquire, watchdog, run `true`, release) next to `flock FILE true`, bare")
w("`true`, `etcdctl lock` and the redis-cli script; then start-up alone (`--version`, `--help`, a usage")
w("error) next to `true`. Mean wall time from `hyperfine -N`, every row of a table in the same hyperfine")
w("run; then the median of as many interleaved rounds (each command once per round, so load that comes")
w("and goes on a shared machine falls on every command alike; the start-up ratios are taken from these);")
w("page faults of every process of one run (" +
  ("`perf stat -e page-faults`, which follows the children" if use_perf else
   "minor + major faults from getrusage, the runner being the subreaper of the run") +
  f", mean of {fault_runs}); peak RSS from ru_maxrss" + (" (`/usr/bin/time -f %M`)" if TIME else "") +
  f", median of {fault_runs}.")
w("")
w("```")
w(command_line)
w("```")
w("")
w(f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {ncpu} CPUs, {cpu}, Linux {os.uname().release}")
w(f"- {version([fencerun, '--version'])} (checkout {revision}); {version(['redis-server', '--version'])}; "
  f"{version(['hyperfine', '--version'])}")
w(f"- uptime before: `{locks['uptime_before']}`; after: `{startup['uptime_after']}`")
if os.environ.get("ETCD_NOTE"):
    w(f"- etcd's data on {os.environ['ETCD_NOTE']}")
w("")
w(f"One locked run of `true` (`hyperfine -N -w {warmup} -r {runs}`; {load_note(locks)}):")
w("")
w("| command | hyperfine mean | vs flock | interleaved median | vs flock | page faults / run | peak RSS |")
w("|---|---|---|---|---|---|---|")
fl = ref(locks["rows"], "flock FILE true")
for r in locks["rows"]:
    w(f"| {label(r)} | {fmt_ms(r)} | {r['mean_ms'] / fl['mean_ms']:.2f}x | {r['interleaved_median_ms']:.2f} ms | "
      f"{r['interleaved_median_ms'] / fl['interleaved_median_ms']:.2f}x | {faults_cell(r)} | {r['rss_kib'] / 1024:.1f} MiB |")
w("")
w(f"Start-up alone (`hyperfine -N -w {warmup} -r {runs}`; {load_note(startup)}):")
w("")
w("| command | hyperfine mean | interleaved median | vs true | vs true --version | page faults / run | peak RSS |")
w("|---|---|---|---|---|---|---|")
tr = ref(startup["rows"], "true")
tv = ref(startup["rows"], "true --version")
for r in startup["rows"]:
    m = r["interleaved_median_ms"]
    w(f"| {label(r)} | {fmt_ms(r)} | {m:.2f} ms | {m / tr['interleaved_median_ms']:.2f}x | "
      f"{m / tv['interleaved_median_ms']:.2f}x | {faults_cell(r)} | {r['rss_kib'] / 1024:.1f} MiB |")
w("")
w("`true --version` is GNU true's start-up plus printing (its locale set-up and a few lines of text),")
w("the reference for fencerun's own printing answers.")
w("")
w("Written by bench/startup.sh; bench/handover.py and bench/waiters.py keep this section.")
w("<!-- startup:end -->")
section = "\n".join(L)
print(section)

if doc != "-":
    splice(doc, "startup", section)
    say(f"wrote the start-up section of {doc}")
PY
