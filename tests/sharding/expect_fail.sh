#!/bin/bash
# expect_fail.sh LIMIT_S REGEX COMMAND...: runs COMMAND under a hard time limit; passes when it
# exits non-zero without hitting the limit and its output (stdout + stderr) matches REGEX.
limit=$1 regex=$2
shift 2
start=$(date +%s.%N)
out=$(timeout -k 5 "$limit" "$@" 2>&1)
rc=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
echo "$out"
echo "expect_fail: exit status $rc after ${elapsed} s"
if [ "$rc" -eq 0 ]; then echo "expect_fail: FAIL: exited 0"; exit 1; fi
# timeout(1) exits 124 (or 137 after -k); a job whose rank was SIGKILLed may also exit 137, so
# decide by the clock.
if [ "$rc" -eq 124 ] || [ "$(echo "$elapsed >= $limit" | bc)" -eq 1 ]; then
  echo "expect_fail: FAIL: hung (killed after $limit s)"; exit 1
fi
if ! grep -qE -- "$regex" <<<"$out"; then echo "expect_fail: FAIL: output lacks /$regex/"; exit 1; fi
echo "expect_fail: ok"
