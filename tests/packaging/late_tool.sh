#!/usr/bin/env bash
# A packaging tool installed after the configure is still used by `--target package`: configure a
# scratch build with rpmbuild hidden (CMAKE_IGNORE_PATH over the system bin directories, every other
# tool the configure needs named explicitly), check that only the .deb is planned, then "install"
# rpmbuild (drop the hiding from the cache and change /usr/bin, as installing a package does) and
# check that the next build re-runs the configure by itself and plans the .rpm too. Exit 77: skipped.
#
#   tests/packaging/late_tool.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: late_tool.sh SOURCE_DIR}
for tool in rpmbuild dpkg-shlibdeps ninja g++ gcc gzip pkg-config redis-server; do
  if [ ! -x "/usr/bin/$tool" ]; then echo "SKIPPED: /usr/bin/$tool is not installed"; exit 77; fi
done
if [ ! -w /usr/bin ]; then echo "SKIPPED: cannot change /usr/bin (not root)"; exit 77; fi
work=$(mktemp -d "${TMPDIR:-/tmp}/fencerun-late-tool.XXXXXX")
trap 'rm -rf "$work"' EXIT
generators() { sed -n 's/^set(CPACK_GENERATOR "\(.*\)")$/\1/p' "$work/b/CPackConfig.cmake"; }

cmake -S "$src" -B "$work/b" -G Ninja "-DCMAKE_IGNORE_PATH=/usr/bin;/bin;/usr/local/bin;/usr/sbin;/sbin" \
  -DCMAKE_MAKE_PROGRAM=/usr/bin/ninja -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_C_COMPILER=/usr/bin/gcc \
  -DGZIP_EXECUTABLE=/usr/bin/gzip -DPKG_CONFIG_EXECUTABLE=/usr/bin/pkg-config \
  -DDPKG_SHLIBDEPS_EXECUTABLE=/usr/bin/dpkg-shlibdeps -DREDIS_SERVER_EXECUTABLE=/usr/bin/redis-server \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; echo "FAILED: the first configure failed"; exit 1; }
[ "$(generators)" = "DEB" ] || { echo "FAILED: with rpmbuild hidden the generators are '$(generators)'"; exit 1; }

# rpmbuild "arrives": it is no longer hidden, and /usr/bin changes as it does when a package installs.
# The cache keeps its time stamp: only the change of /usr/bin may trigger the re-configure.
touch -r "$work/b/CMakeCache.txt" "$work/stamp"
sed -i 's|^\(CMAKE_IGNORE_PATH:[A-Z]*\)=.*|\1=|' "$work/b/CMakeCache.txt"
touch -r "$work/stamp" "$work/b/CMakeCache.txt"
sleep 1  # a coarser file system time stamp than the configure's own would hide the change
touch /usr/bin
cmake --build "$work/b" --target help >"$work/rebuild.log" 2>&1 || { cat "$work/rebuild.log"; exit 1; }
[ "$(generators)" = "DEB;RPM" ] || { echo "FAILED: after rpmbuild arrived the generators are '$(generators)'"; exit 1; }
echo "a tool installed after the configure is picked up by the next build: $(generators)"
