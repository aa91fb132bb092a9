#!/usr/bin/env bash
# The Debian package of the C++ API (issue 40), checked on this machine without a container:
# CPack builds build/shardwise-dev_<version>_<arch>.deb from the build folder (scripts/build.sh
# first), dpkg installs it under /usr, examples/external configures and builds against it
# (nothing but the system's paths: no CMAKE_PREFIX_PATH) and trains one rank a few steps,
# then dpkg removes it and the script checks that nothing it installed is left. Needs root
# (or sudo) and a machine without another shardwise-dev installed. Prints the package's size
# and file count and each phase's time.
#   scripts/package_check.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
esac
build=${1:-build}
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
if dpkg-query -W -f='${Status}' shardwise-dev 2>/dev/null | grep -q "install ok installed"; then
  echo "package_check: shardwise-dev is installed already; remove it first (dpkg -r shardwise-dev)" >&2
  exit 1
fi
[ -f "$build/CPackConfig.cmake" ] || { echo "package_check: $build is not configured: run scripts/build.sh" >&2; exit 1; }
work=$(mktemp -d)
installed=0
cleanup() {
  ((installed)) && $SUDO dpkg -r shardwise-dev >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }

t=$(date +%s%N)
cmake --build "$build" --target sw_package shardwise $(cmake --build "$build" --target help 2>/dev/null | grep -qo 'sw_package_cuda:' && echo sw_package_cuda) >/dev/null
(cd "$build" && cpack -G DEB -B "$work/deb" >"$work/cpack.log") || { cat "$work/cpack.log"; exit 1; }
deb=$(ls "$work"/deb/shardwise-dev_*.deb)
echo "package_check: $(basename "$deb"): $(du -h "$deb" | cut -f1), $(dpkg-deb -c "$deb" | grep -vc '/$') files ($(ms "$t") ms)"
grep -q 'SW_NATIVE:BOOL=ON' "$build/CMakeCache.txt" &&
  echo "package_check: note: built with -march=native (SW_NATIVE=ON): the package runs on CPUs like this one"

t=$(date +%s%N)
$SUDO dpkg -i "$deb" >"$work/dpkg.log" || { cat "$work/dpkg.log"; exit 1; }
installed=1
echo "package_check: installed under /usr ($(ms "$t") ms): $(dpkg -L shardwise-dev | grep -c 'include/shardwise/.*\.h$') headers," \
     "$(dpkg -L shardwise-dev | grep -E '\.a$' | xargs -n1 basename | paste -sd' ')"

t=$(date +%s%N)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S examples/external -B "$work/ext" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
t1=$(date +%s%N)
cmake --build "$work/ext" >"$work/build.log" || { cat "$work/build.log"; exit 1; }
echo "package_check: external project: configure $(((t1 - t) / 1000000)) ms, build $(ms "$t1") ms"
(cd "$work" && OMP_NUM_THREADS=2 "$work/ext/external_train" --steps 40) | tail -4
pkg-config --exists shardwise && echo "package_check: pkg-config: $(pkg-config --modversion shardwise)"

$SUDO dpkg -r shardwise-dev >/dev/null
installed=0
left=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\.||' | grep -v '/$' | while read -r f; do [ -e "$f" ] && echo "$f"; done || true)
if [ -n "$left" ]; then echo "package_check: left after dpkg -r:"; echo "$left"; exit 1; fi
echo "package_check: removed; nothing left; ok"
