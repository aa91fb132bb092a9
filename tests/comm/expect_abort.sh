#!/bin/bash
# expect_abort.sh LIMIT_S REGEX COMMAND...: runs COMMAND with a hard limit and passes when it
# exits non-zero (but not by hitting the limit) and its output matches REGEX.
limit=$1 regex=$2
shift 2
start=$(date +%s%N)
out=$(timeout -k 5 "$limit" "$@" 2>&1)
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out"
echo "expect_abort: exit status $rc after ${elapsed_ms} ms"
if [ "$rc" -eq 0 ]; then echo "expect_abort: FAIL: exited 0"; exit 1; fi
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "expect_abort: FAIL: hung (killed after $limit s)"; exit 1; fi
if ! grep -qE -- "$regex" <<<"$out"; then echo "expect_abort: FAIL: output lacks /$regex/"; exit 1; fi
echo "expect_abort: ok"
