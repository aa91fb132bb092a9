#!/usr/bin/env bash
# The installed package works from outside the tree (issue 40): `cmake --install` of the build
# into a temporary prefix, the prefix moved elsewhere (the package must be relocatable: no
# installed CMake or pkg-config file may name the build or source folder), then
# examples/external configured against it with CMAKE_PREFIX_PATH, built and run (one rank, a
# few steps: it exits non-zero unless its models learn and its checkpoint loads back); the
# same source built with `pkg-config --cflags --libs shardwise` alone runs too.
# Prints the installed files' count and size and the external project's configure+build time.
#   install_external.sh SOURCE_DIR BINARY_DIR [CXX]
set -euo pipefail
src=$1 bin=$2 cxx=${3:-c++}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$bin" --prefix "$work/staged" >"$work/install.log"
mv "$work/staged" "$work/prefix"
prefix=$work/prefix
echo "installed: $(find "$prefix" -type f | wc -l) files, $(du -sh "$prefix" | cut -f1)" \
     "($(find "$prefix/include" -type f | wc -l) headers)"
if grep -rlF -e "$src" -e "$bin" "$prefix" --include='*.cmake' --include='*.pc' --include='*.h'; then
  echo "FAIL: the installed files above name the source or build folder"
  exit 1
fi
# Nor the archives' loaded data (SW_CHECK's __FILE__: -fmacro-prefix-map; debug sections aside).
for a in "$prefix"/lib*/*.a; do
  n=$(strings -d "$a" | grep -cF -e "$src/" -e "$bin/" || true)
  [ "$n" = 0 ] || { echo "FAIL: $a names the source or build folder $n times"; exit 1; }
done
for internal in sharding planner engine checkpoint; do
  if [ -e "$prefix/include/$internal" ]; then echo "FAIL: internal headers installed ($internal/)"; exit 1; fi
done
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
t0=$(date +%s%N)
cmake -S "$src/examples/external" -B "$work/ext" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
t1=$(date +%s%N)
cmake --build "$work/ext" >"$work/build.log" || { cat "$work/build.log"; exit 1; }
t2=$(date +%s%N)
echo "external project: configure $(((t1 - t0) / 1000000)) ms, build $(((t2 - t1) / 1000000)) ms"
cd "$work"
"$work/ext/external_train" --steps 40
# The same program built with nothing but pkg-config's flags (the CPU backend).
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs shardwise)
echo "pkg-config: $flags"
# shellcheck disable=SC2086
"$cxx" -O1 "$src/examples/external/main.cpp" $flags -o "$work/external_pc"
"$work/external_pc" --steps 30 --dir "$work/pc.out" | tail -1
