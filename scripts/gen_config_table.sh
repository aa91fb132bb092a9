#!/usr/bin/env bash
# Regenerates README.md's configuration key table (between the config-keys markers) from the
# key declaration in engine/config.cpp, with tools/config_table built in ${BUILD_DIR:-build}.
# The unit test "config schema: README.md's key table is the generated one" fails until the
# table is regenerated after a declaration changes.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
[ -f "$build/build.ninja" ] || [ -f "$build/Makefile" ] ||
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target config_table >/dev/null
table=$(mktemp)
out=$(mktemp README.md.XXXXXX)
trap 'rm -f "$table" "$out"' EXIT
"$build/tools/config_table" >"$table"
grep -q '^<!-- config-keys:begin -->$' README.md && grep -q '^<!-- config-keys:end -->$' README.md || {
  echo "gen_config_table.sh: README.md lacks the <!-- config-keys:begin/end --> markers" >&2
  exit 1
}
awk -v table="$table" '
  /^<!-- config-keys:begin -->$/ { print; while ((getline line < table) > 0) print line; skip = 1; next }
  /^<!-- config-keys:end -->$/ { skip = 0 }
  !skip { print }
' README.md >"$out"
if cmp -s "$out" README.md; then
  echo "README.md: the config key table is up to date"
else
  cat "$out" >README.md
  echo "README.md: config key table regenerated"
fi
