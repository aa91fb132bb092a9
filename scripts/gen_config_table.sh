#!/usr/bin/env bash
# Regenerates README.md's generated tables from their declarations, with tools/config_table
# built in ${BUILD_DIR:-build}: the configuration keys (engine/config_schema.cpp) between the
# config-keys markers, the environment switches (core/env.cpp) between the env-switches
# markers. The unit tests "config schema: README.md's key table is the generated one" and
# "env: README.md's switch table is the generated one" fail until the tables are regenerated
# after a declaration changes.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
[ -f "$build/build.ninja" ] || [ -f "$build/Makefile" ] ||
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target config_table >/dev/null
table=$(mktemp)
out=$(mktemp README.md.XXXXXX)
trap 'rm -f "$table" "$out"' EXIT

# regenerate MARKER [ARGS...]: README.md with the table `config_table ARGS` prints between
# <!-- MARKER:begin --> and <!-- MARKER:end -->.
regenerate() {
  local marker=$1
  shift
  "$build/tools/config_table" "$@" >"$table"
  grep -q "^<!-- $marker:begin -->\$" README.md && grep -q "^<!-- $marker:end -->\$" README.md || {
    echo "gen_config_table.sh: README.md lacks the <!-- $marker:begin/end --> markers" >&2
    exit 1
  }
  awk -v table="$table" -v begin="<!-- $marker:begin -->" -v end="<!-- $marker:end -->" '
    $0 == begin { print; while ((getline line < table) > 0) print line; skip = 1; next }
    $0 == end { skip = 0 }
    !skip { print }
  ' README.md >"$out"
  if cmp -s "$out" README.md; then
    echo "README.md: the $marker table is up to date"
  else
    cat "$out" >README.md
    echo "README.md: $marker table regenerated"
  fi
}

regenerate config-keys
regenerate env-switches --env
