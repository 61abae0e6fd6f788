#!/usr/bin/env bash
# Core costs of one `fencerun NAME -- true` run against a private local redis-server:
#   1. Redis traffic: commands seen by MONITOR (Lua-internal ones left out), INFO commandstats
#      deltas, and request writes on the Redis socket (strace, when installed);
#   2. wall time against `flock FILE true` and bare `true` (median of 20 runs each);
#   3. fencerun's peak RSS.
# Not part of the test suite. Run it after building:
#   cmake -S . -B build -G Ninja && cmake --build build && bench/core.sh
# FENCERUN=path/to/fencerun overrides the binary (default: build/src/fencerun in this checkout).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${FENCERUN:-}" ]]; then
  fencerun="$(realpath "$FENCERUN")"
else
  fencerun="$repo/build/src/fencerun"
fi
runs=20
lock="bench-core"

die() { echo "core.sh: $*" >&2; exit 1; }
[[ -x "$fencerun" ]] || die "no fencerun binary at $fencerun (build first, or set FENCERUN)"
for tool in redis-server redis-cli flock; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done

work="$(mktemp -d "${TMPDIR:-/tmp}/fencerun-bench.XXXXXX")"
redis_pid=""
monitor_pid=""
cleanup() {
  [[ -n "$monitor_pid" ]] && kill "$monitor_pid" 2>/dev/null || true
  if [[ -n "$redis_pid" ]]; then
    kill "$redis_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# A free loopback port below 32768 (out of the usual ephemeral range).
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=""
for _ in $(seq 100); do
  candidate=$((20000 + RANDOM % 12768))
  if ! port_in_use "$candidate"; then port="$candidate"; break; fi
done
[[ -n "$port" ]] || die "found no free port"

redis-server --bind 127.0.0.1 --port "$port" --daemonize yes --pidfile "$work/redis.pid" \
  --dir "$work" --logfile "$work/redis.log" --save '' --appendonly no >/dev/null
for _ in $(seq 100); do
  [[ -s "$work/redis.pid" ]] && redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && break
  sleep 0.05
done
redis_pid="$(cat "$work/redis.pid" 2>/dev/null || true)"
[[ -n "$redis_pid" ]] && redis-cli -p "$port" PING 2>/dev/null | grep -q PONG ||
  die "redis-server did not start on port $port: $(tail -3 "$work/redis.log" 2>/dev/null)"

cli() { redis-cli -p "$port" "$@"; }
url="redis://127.0.0.1:$port"
run_fencerun() { "$fencerun" --redis "$url" "$lock" -- true; }

# Every run must succeed: a lock left behind would turn later runs into fast conflicts.
rc=0; run_fencerun || rc=$?
[[ $rc -eq 0 ]] || die "fencerun $lock -- true exited $rc (see above)"

# --- 1. Redis traffic of one run -------------------------------------------------------------

# Commands sent by clients during one run, as MONITOR shows them; lines tagged "lua" ran inside a script.
monitor_one_run() {
  local out="$1"
  redis-cli -p "$port" MONITOR >"$out" &  # a plain command, so $! is redis-cli itself
  monitor_pid=$!
  for _ in $(seq 100); do [[ -s "$out" ]] && break; sleep 0.02; done  # "OK": MONITOR is attached
  run_fencerun
  sleep 0.2
  kill "$monitor_pid" 2>/dev/null || true
  wait "$monitor_pid" 2>/dev/null || true
  monitor_pid=""
}
count_client_commands() { grep -E '^[0-9]+\.[0-9]+ \[[0-9]+ ' "$1" | grep -vc ' lua\]' || true; }
command_names() {
  grep -E '^[0-9]+\.[0-9]+ \[[0-9]+ ' "$1" | grep -v ' lua\]' |
    sed -E 's/^[^"]*"([^"]*)".*/\1/' | tr '[:upper:]' '[:lower:]' | paste -sd' ' -
}

monitor_one_run "$work/monitor-warm.txt"
warm_commands="$(count_client_commands "$work/monitor-warm.txt")"
warm_names="$(command_names "$work/monitor-warm.txt")"

cli SCRIPT FLUSH >/dev/null
monitor_one_run "$work/monitor-cold.txt"
cold_commands="$(count_client_commands "$work/monitor-cold.txt")"
cold_names="$(command_names "$work/monitor-cold.txt")"

# INFO commandstats deltas for one (warm) run; commands run by scripts are counted too.
cli CONFIG RESETSTAT >/dev/null
run_fencerun
commandstats="$(cli INFO commandstats | tr -d '\r' |
  sed -nE 's/^cmdstat_([^:]+):calls=([0-9]+).*/\1=\2/p' | grep -v '^config|resetstat=' | sort | paste -sd' ' -)"
commandstats_total="$(tr ' ' '\n' <<<"$commandstats" | awk -F= '{s += $2} END {print s + 0}')"

# Writes on the Redis socket: each one is a request the client then waits for (a round trip).
request_writes="n/a (strace not installed)"
if command -v strace >/dev/null; then
  strace -f -qq -o "$work/strace.txt" -e trace=connect,write,writev,sendto,sendmsg "$fencerun" \
    --redis "$url" "$lock" -- true >/dev/null 2>&1 || true
  request_writes="$(awk -v port="$port" '
    { sub(/^[0-9]+ +/, "") }
    /^connect\(/ && index($0, "htons(" port ")") { fd = $0; sub(/^connect\(/, "", fd); sub(/,.*/, "", fd); redis[fd] = 1; next }
    /^(write|writev|sendto|sendmsg)\(/ { fd = $0; sub(/^[a-z]+\(/, "", fd); sub(/,.*/, "", fd); if (fd in redis) n++ }
    END { print n + 0 }' "$work/strace.txt")"
fi

# --- 2. Wall time --------------------------------------------------------------------------------

flock_file="$work/flock"
median_fencerun="" median_flock="" median_true="" timer=""
if command -v hyperfine >/dev/null; then
  timer="hyperfine, $runs runs after 3 warm-ups"
  hyperfine -N --warmup 3 --runs "$runs" --export-json "$work/hyperfine.json" \
    "$fencerun --redis $url $lock -- true" "flock $flock_file true" "true" >/dev/null 2>&1
  read -r median_fencerun median_flock median_true < <(
    jq -r '[.results[].median * 1000 | . * 1000 | round / 1000 | tostring] | join(" ")' "$work/hyperfine.json")
else
  timer="date +%s%N loop, $runs runs after 3 warm-ups"
  median_ms() {
    local samples=() start end
    for i in $(seq $((runs + 3))); do
      start=$(date +%s%N); "$@" >/dev/null; end=$(date +%s%N)
      ((i > 3)) && samples+=($((end - start)))
    done
    printf '%s\n' "${samples[@]}" | sort -n |
      awk '{a[NR] = $1} END {m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.3f", m / 1e6}'
  }
  median_fencerun="$(median_ms "$fencerun" --redis "$url" "$lock" -- true)"
  median_flock="$(median_ms flock "$flock_file" true)"
  median_true="$(median_ms true)"
fi

# --- 3. Peak RSS ---------------------------------------------------------------------------------

peak_rss() {
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -f %M -o "$work/rss.txt" "$@" >/dev/null
    echo "$(tail -1 "$work/rss.txt") KiB"
  else
    echo "n/a (install the time package)"
  fi
}
rss_fencerun="$(peak_rss "$fencerun" --redis "$url" "$lock" -- true)"
rss_flock="$(peak_rss flock "$flock_file" true)"

# The lock must be free again and the token counter must have moved on.
held="$(cli EXISTS "fencerun:{$lock}:lock")"
token="$(cli GET "fencerun:{$lock}:token")"

# --- Report --------------------------------------------------------------------------------------

echo "## fencerun core costs"
echo
echo "$("$fencerun" --version 2>/dev/null | head -1 || echo 'fencerun ?'); $(redis-server --version | cut -d' ' -f1-3); $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg)"
echo
echo "| measure | value |"
echo "|---|---|"
echo "| Redis commands from one run, scripts cached (MONITOR, Lua-internal excluded) | $warm_commands: $warm_names |"
echo "| Redis commands from one run after SCRIPT FLUSH (MONITOR, Lua-internal excluded) | $cold_commands: $cold_names |"
echo "| INFO commandstats delta of one run (includes commands run by scripts) | $commandstats_total: $commandstats |"
echo "| request writes on the Redis socket in one run (strace) | $request_writes |"
echo "| wall time, median: \`fencerun NAME -- true\` | $median_fencerun ms |"
echo "| wall time, median: \`flock FILE true\` | $median_flock ms |"
echo "| wall time, median: \`true\` | $median_true ms |"
echo "| peak RSS: \`fencerun NAME -- true\` | $rss_fencerun |"
echo "| peak RSS: \`flock FILE true\` | $rss_flock |"
echo "| lock key left after the runs / last token | $held / $token |"
echo
echo "Timing: $timer, measured in the same run."
