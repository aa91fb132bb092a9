#!/usr/bin/env bash
# The planner on a custom model whose blocks do not declare their activation sizes
# (examples/custom_model.cpp --undeclared): one line on stderr naming the unit, exit 1, nothing
# on stdout; with --measure-unknown it measures those calls and predicts what the declaring
# model predicts.
set -u
bin=$1
err=$("$bin" --plan --world-size 2 --undeclared 2>&1 >/tmp/plan_undeclared.$$.out)
rc=$?
out=$(cat /tmp/plan_undeclared.$$.out); rm -f /tmp/plan_undeclared.$$.out
fail() { echo "FAIL: $*"; echo "stdout: $out"; echo "stderr: $err"; exit 1; }
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1"
[ -z "$out" ] || fail "printed a plan"
[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "not one line"
printf '%s' "$err" | grep -q "^plan: unit 'blocks.0' (call 0)" || fail "does not name the unit"
declared=$("$bin" --plan --world-size 2) || fail "the declaring model does not plan"
measured=$("$bin" --plan --world-size 2 --undeclared --measure-unknown) || fail "--measure-unknown failed"
printf '%s\n' "$measured" | grep -q "^measured blocks.0 call 0" || fail "no measured line: $measured"
[ "$(printf '%s\n' "$measured" | tail -1)" = "$declared" ] ||
  fail "measured plan '$(printf '%s\n' "$measured" | tail -1)' != declared '$declared'"
echo "ok: $err"
