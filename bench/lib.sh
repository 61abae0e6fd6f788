# Shared by the bench/*.sh scripts (sourced after they define say and die).

# need PROGRAM PACKAGE...: records PACKAGE when PROGRAM is missing; install_missing then installs them
# all with apt-get (after an update if the first try fails).
missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
install_missing() {
  ((${#missing[@]})) || return 0
  say "installing ${missing[*]}"
  local sudo=""
  ((EUID == 0)) || sudo="sudo"
  $sudo apt-get install -y "${missing[@]}" >/dev/null ||
    { $sudo apt-get update >/dev/null && $sudo apt-get install -y "${missing[@]}" >/dev/null; } ||
    die "could not install ${missing[*]}"
}

# Free loopback ports below 32768 (out of the usual ephemeral range), all different.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
taken=" "
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 12000))
    [[ "$taken" == *" $p "* ]] && continue
    port_in_use "$p" || port_in_use "$((p + 1))" || { taken+="$p "; echo "$p"; return; }
  done
  die "found no free port"
}

# start_etcd NAME: a one-member etcd on $endpoint / $peer_port with its log in $work/etcd.log, its data
# on tmpfs when there is one (its fsyncs then cost little, as Redis here writes nothing to disk); sets
# etcd_pid, etcd_data (for the clean-up) and etcd_data_note, and returns once it is healthy.
start_etcd() {
  if [[ -d /dev/shm && -w /dev/shm ]]; then
    etcd_data="$(mktemp -d "/dev/shm/fencerun-$1-etcd.XXXXXX")"
    etcd_data_note="tmpfs (fsync costs little there, as Redis here writes nothing to disk)"
  else
    etcd_data="$work/etcd"
    etcd_data_note="disk (no writable /dev/shm: etcd pays for fsync, Redis here does not)"
  fi
  etcd --name bench --data-dir "$etcd_data/d" \
    --listen-client-urls "$endpoint" --advertise-client-urls "$endpoint" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "bench=http://127.0.0.1:$peer_port" >"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 100); do
    etcdctl --endpoints="$endpoint" --command-timeout=1s endpoint health >/dev/null 2>&1 && break
    kill -0 "$etcd_pid" 2>/dev/null || die "etcd exited: $(tail -3 "$work/etcd.log")"
    sleep 0.1
  done
  etcdctl --endpoints="$endpoint" endpoint health >/dev/null 2>&1 || die "etcd did not become healthy"
}

# start_redis [ARG...]: a redis-server without persistence on 127.0.0.1:$redis_port (its pid file, log
# and directory in $work), with the extra arguments given; sets redis_pid once it answers PING.
start_redis() {
  redis-server --bind 127.0.0.1 --port "$redis_port" --daemonize yes --pidfile "$work/redis.pid" \
    --dir "$work" --logfile "$work/redis.log" --save '' --appendonly no "$@" >/dev/null
  for _ in $(seq 100); do
    [[ -s "$work/redis.pid" ]] && redis-cli -p "$redis_port" PING 2>/dev/null | grep -q PONG && break
    sleep 0.05
  done
  redis_pid="$(cat "$work/redis.pid" 2>/dev/null || true)"
  [[ -n "$redis_pid" ]] || die "redis-server did not start: $(tail -3 "$work/redis.log" 2>/dev/null)"
}

# The Python helpers of bench/lib.py: splice, hyperfine_rows, ...
bench_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# bench_python ARG...: python3 with bench/ on its path, so that inline Python can `import lib`.
bench_python() { PYTHONPATH="$bench_dir${PYTHONPATH:+:$PYTHONPATH}" python3 "$@"; }

# splice_section DOC TAG SECTION: SECTION (from <!-- TAG:begin --> to <!-- TAG:end -->, included) in
# place of DOC's section TAG, or appended to DOC when it has none; DOC - prints SECTION only.
splice_section() { python3 "$bench_dir/lib.py" splice "$@"; }

# wait_for_quiet SECONDS: waits (up to SECONDS) until the load average is below the number of CPUs
# (LOAD_MAX overrides it), then sets load_before to `uptime`; dies when it stayed at or above: a figure
# taken at a load above the core count is not a figure.
wait_for_quiet() {
  local ncpu="${LOAD_MAX:-$(nproc)}" deadline=$((SECONDS + $1))
  while awk -v n="$ncpu" '{exit !($1 >= n)}' /proc/loadavg && ((SECONDS < deadline)); do
    say "load $(cut -d' ' -f1 /proc/loadavg) >= $ncpu CPUs: waiting for it to settle"
    sleep 10
  done
  load_before="$(uptime)"
  if awk -v n="$ncpu" '{exit !($1 >= n)}' /proc/loadavg; then die "load stayed at or above $ncpu: not measuring ($load_before)"; fi
}
