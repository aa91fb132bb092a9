#!/usr/bin/env bash
# Each public header compiles alone (issue 40): for every include/shardwise/*.h (and the
# generated version.h), a translation unit holding only `#include <shardwise/NAME.h>` is
# compiled with nothing but the public include folders on the path (not the tree's root, so an
# internal header included by mistake fails), -Wall -Wextra -Werror; and no public header names
# an include outside shardwise/ in quotes. Prints each header's compile time, their sum and max.
#   compile_headers.sh CXX SOURCE_DIR BINARY_DIR
set -euo pipefail
cxx=$1 src=$2 bin=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
headers=("$src"/include/shardwise/*.h "$bin"/include/shardwise/version.h)
total=0 max=0 maxname=""
for h in "${headers[@]}"; do
  name=$(basename "$h")
  if grep -nE '^\s*#\s*include\s+"' "$h" | grep -vE '"shardwise/[a-z_]+\.h"'; then
    echo "FAIL $name: includes a header outside shardwise/ (above)"
    fail=1
  fi
  printf '#include <shardwise/%s>\n#include <shardwise/%s>\n' "$name" "$name" >"$work/$name.cpp"
  t0=$(date +%s%N)
  if ! "$cxx" -std=c++20 -Wall -Wextra -Werror -fsyntax-only -I"$src/include" -I"$bin/include" \
      "$work/$name.cpp" 2>"$work/$name.err"; then
    echo "FAIL $name: does not compile alone:"
    head -20 "$work/$name.err"
    fail=1
    continue
  fi
  ms=$((($(date +%s%N) - t0) / 1000000))
  total=$((total + ms))
  ((ms > max)) && max=$ms maxname=$name
  printf '%-20s %5d ms\n' "$name" "$ms"
done
echo "compile_headers: ${#headers[@]} headers, sum $total ms, max $max ms ($maxname)"
exit $fail
