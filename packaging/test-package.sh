#!/usr/bin/env bash
# Builds the .deb and .rpm and tests them as a user would meet them:
#   - lintian on the .deb (errors fail; warnings and info are shown);
#   - dpkg -i, then: fencerun --version, man -w fencerun, the completions, the examples, and a real
#     locked run against a private redis-server (free port, stopped by pid);
#   - dpkg -r, and /usr/bin/fencerun is gone;
#   - rpm -qlp lists the binary, the man page and the completions.
#
#   packaging/test-package.sh [BUILD_DIR]     (default: build; run as root: it installs the .deb)
#
# Needs: dpkg-dev, lintian, rpm, man-db, redis-server (scripts/setup --deps-only --ci installs them).
# A fencerun package that was installed before (scripts/setup installs the one it builds) is replaced
# by the one just built, and that one is installed again after the removal test: the machine ends
# with a fencerun on PATH as it began, now of this build.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:-build}

say() { printf '\n==> %s\n' "$*"; }
fail() { printf 'test-package: FAILED: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "run as root: the test installs and removes the .deb"
[ -f "$BUILD/CMakeCache.txt" ] || fail "$BUILD is not a configured build directory"
for tool in dpkg-deb lintian rpm rpmbuild man redis-server redis-cli; do
  command -v "$tool" >/dev/null || fail "$tool is missing (scripts/setup --deps-only --ci installs it)"
done
WAS_INSTALLED=0
if dpkg-query -W -f='${Status}' fencerun 2>/dev/null | grep -q ' installed$'; then
  WAS_INSTALLED=1
  echo "a fencerun package is installed ($(dpkg-query -W -f='${Version}' fencerun)): it is replaced by this build's"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fencerun-pkg.XXXXXX")
REDIS_PID=
INSTALLED=0
cleanup() {
  if [ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null; then kill "$REDIS_PID" 2>/dev/null || true; fi
  if [ "$INSTALLED" -eq 1 ] && [ "$WAS_INSTALLED" -eq 0 ]; then dpkg -r fencerun >/dev/null 2>&1 || true; fi
  # Failed between the removal and the reinstall: leave fencerun installed, as it was found.
  if [ "$WAS_INSTALLED" -eq 1 ] && [ -n "${DEB:-}" ] && [ ! -e /usr/bin/fencerun ]; then
    dpkg -i "$DEB" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

say "building the packages"
rm -f "$BUILD"/fencerun*.deb "$BUILD"/fencerun*.rpm
cmake --build "$BUILD" --target package
# A glob, not `ls | head` (which exits non-zero under pipefail when nothing matches, silently).
DEB=$(compgen -G "$BUILD/fencerun_*.deb" | head -n1 || true)
RPM=$(compgen -G "$BUILD/fencerun-*.rpm" | head -n1 || true)
[ -n "$DEB" ] || fail "no .deb in $BUILD (is dpkg-dev installed?)"
[ -n "$RPM" ] || fail "no .rpm in $BUILD (is rpm installed?)"
echo "deb: $DEB"
echo "rpm: $RPM"

say "contents of the .deb"
dpkg-deb --info "$DEB" | sed -n '/Package:/,$p'
dpkg-deb --contents "$DEB"

say "lintian (errors fail the test)"
set +e
lintian --info --display-info --tag-display-limit 0 "$DEB" >"$WORK/lintian.txt" 2>&1
lintian_rc=$?
set -e
cat "$WORK/lintian.txt"
if grep -q '^E: ' "$WORK/lintian.txt"; then fail "lintian reported errors"; fi
# lintian exits 1 on errors (its default --fail-on) and 2 when it could not run at all.
[ "$lintian_rc" -eq 0 ] || fail "lintian exited $lintian_rc"
echo "lintian: no errors ($(grep -c '^W: ' "$WORK/lintian.txt" || true) warnings, $(grep -c '^I: ' "$WORK/lintian.txt" || true) info)"

say "installing the .deb"
INSTALLED=1
if ! dpkg -i "$DEB"; then
  echo "dpkg -i could not configure the package; fetching its dependencies"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -f install -y
fi
dpkg-query -W -f='${Status}\n' fencerun | grep -q '^install ok installed$' || fail "fencerun is not installed"

say "checking the installed files"
[ "$(command -v fencerun)" = /usr/bin/fencerun ] || fail "fencerun is not /usr/bin/fencerun on PATH"
/usr/bin/fencerun --version | tee "$WORK/version"
grep -q '^fencerun [0-9]' "$WORK/version" || fail "--version does not print the version"
grep -q '^hiredis [0-9]' "$WORK/version" || fail "--version does not print the hiredis version"
grep -q '^features: .*tls' "$WORK/version" || fail "--version does not print the features"
man_page=$(man -w fencerun) || fail "man -w fencerun found no man page"
echo "man page: $man_page"
[ "$man_page" = /usr/share/man/man1/fencerun.1.gz ] || fail "man page at $man_page"
# The page renders without groff warnings.
if MANWIDTH=80 man --warnings "$man_page" 2>&1 >/dev/null | grep .; then fail "the man page renders with warnings"; fi
for f in /usr/share/bash-completion/completions/fencerun /usr/share/zsh/vendor-completions/_fencerun \
  /usr/share/fish/vendor_completions.d/fencerun.fish /usr/share/doc/fencerun/copyright \
  /usr/share/doc/fencerun/changelog.gz /usr/share/doc/fencerun/README.md \
  /usr/share/doc/fencerun/docs/fencing.md /usr/share/doc/fencerun/docs/quorum.md \
  /usr/share/doc/fencerun/docs/benchmarks.md \
  /usr/share/doc/fencerun/examples/crontab /usr/share/doc/fencerun/examples/fencerun-orders-sync.service \
  /usr/share/doc/fencerun/examples/fencerun-orders-sync.timer /usr/share/doc/fencerun/examples/gitlab-ci.yml \
  /usr/share/doc/fencerun/examples/github-actions.yml /usr/share/doc/fencerun/examples/kubernetes-cronjob.yaml; do
  [ -f "$f" ] || fail "$f is missing"
  echo "present: $f"
done
# The completion loads in bash and offers the subcommands.
offered=$(bash -c 'source /usr/share/bash-completion/bash_completion
  source /usr/share/bash-completion/completions/fencerun
  COMP_WORDS=(fencerun ""); COMP_CWORD=1; COMP_LINE="fencerun "; COMP_POINT=9
  _fencerun fencerun "" fencerun 2>/dev/null; echo "${COMPREPLY[*]}"')
echo "bash completion of 'fencerun <TAB>': $offered"
for sub in run status acl fence; do
  case " $offered " in *" $sub "*) ;; *) fail "bash completion does not offer the subcommand $sub" ;; esac
done
# The installed units verify as they are (ExecStart=/usr/bin/fencerun, man:fencerun(1)).
if command -v systemd-analyze >/dev/null && command -v python3 >/dev/null; then
  python3 tests/packaging/check_examples.py systemd /usr/share/doc/fencerun/examples
else
  echo "systemd-analyze or python3 missing: installed units not verified"
fi

say "a real locked run with the installed fencerun"
port=
for _ in $(seq 1 50); do
  candidate=$((20000 + RANDOM % 12000))
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then port=$candidate; break; fi
done
[ -n "$port" ] || fail "no free port found"
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --dir "$WORK" --pidfile "$WORK/redis.pid" --logfile "$WORK/redis.log"
for _ in $(seq 1 200); do
  [ -s "$WORK/redis.pid" ] && redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
REDIS_PID=$(cat "$WORK/redis.pid" 2>/dev/null || true)
[ -n "$REDIS_PID" ] && redis-cli -p "$port" ping >/dev/null || fail "redis-server did not start on port $port"
echo "redis-server pid $REDIS_PID on 127.0.0.1:$port"
url="redis://127.0.0.1:$port"

(cd "$WORK" && fencerun -r "$url" -v --metrics-file "$WORK/run.prom" pkg-test -- \
  sh -c 'echo "$FENCERUN_TOKEN" > token; [ "$FENCERUN_LOCK" = pkg-test ] || exit 9; fencerun status -r "$FENCERUN_REDIS_URL" pkg-test > status; exit 5') \
  && rc=0 || rc=$?
[ "$rc" -eq 5 ] || fail "the locked run exited $rc, expected the command's 5"
token=$(cat "$WORK/token")
echo "the command got token $token"
grep -q "^token: $token$" "$WORK/status" || fail "status during the run did not show token $token: $(cat "$WORK/status")"
grep -q "^fencerun_last_token{lock=\"pkg-test\"} $token$" "$WORK/run.prom" || fail "metrics file lacks the token"
set +e
fencerun status -r "$url" pkg-test
status_rc=$?
set -e
[ "$status_rc" -eq 3 ] || fail "fencerun status after the run exited $status_rc, expected 3 (free)"
[ "$(redis-cli -p "$port" get 'fencerun:{pkg-test}:token')" = "$token" ] || fail "the token key does not hold $token"
kill "$REDIS_PID"
for _ in $(seq 1 100); do kill -0 "$REDIS_PID" 2>/dev/null || break; sleep 0.05; done
REDIS_PID=

say "removing the .deb"
dpkg -r fencerun
INSTALLED=0
[ ! -e /usr/bin/fencerun ] || fail "/usr/bin/fencerun is still there after dpkg -r"
[ ! -e /usr/share/man/man1/fencerun.1.gz ] || fail "the man page is still there after dpkg -r"
echo "/usr/bin/fencerun is gone"
if [ "$WAS_INSTALLED" -eq 1 ]; then
  say "installing this build's .deb again (a fencerun package was installed before the test)"
  dpkg -i "$DEB"
  INSTALLED=0
fi

say "contents of the .rpm"
rpm -qip "$RPM" 2>/dev/null | sed -n '1,12p'
rpm -qlp "$RPM" 2>/dev/null | tee "$WORK/rpm-files"
for f in /usr/bin/fencerun /usr/share/man/man1/fencerun.1.gz /usr/share/bash-completion/completions/fencerun \
  /usr/share/zsh/vendor-completions/_fencerun /usr/share/fish/vendor_completions.d/fencerun.fish \
  /usr/share/doc/fencerun/examples/fencerun-orders-sync.service; do
  grep -qx "$f" "$WORK/rpm-files" || fail "the .rpm does not contain $f"
done
# The rpm must not claim directories that belong to the system.
for d in /usr /usr/bin /usr/share /usr/share/man /usr/share/man/man1; do
  if grep -qx "$d" "$WORK/rpm-files"; then fail "the .rpm owns the system directory $d"; fi
done

say "package test passed"
