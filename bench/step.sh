#!/usr/bin/env bash
# Step throughput, Shardwise vs PyTorch on the same shapes, in the same run, alternating the
# two (A B A B) so that machine noise hits both alike. Prints each run and the ratios.
#
#   bench/step.sh [BUILD_DIR] [-- extra bench_step args]   (default: GPT-2 124M, T=256, B=4)
# Environment: THREADS (2), ROUNDS (2), STEPS (5), TORCH_DTYPE (fp32).
set -euo pipefail
build=${1:-build}
shift || true
[ "${1:-}" = "--" ] && shift
threads=${THREADS:-2} rounds=${ROUNDS:-2} steps=${STEPS:-5}
here=$(cd "$(dirname "$0")" && pwd)
args=(--threads "$threads" --steps "$steps" "$@")
# bench_step's shape flags map one-to-one onto torch_step.py's.
torch_args=(--threads "$threads" --steps "$steps" --dtype "${TORCH_DTYPE:-fp32}")
while (($#)); do
  case $1 in
    --d|--layers|--heads|--vocab|--T|--B) torch_args+=("$1" "$2"); shift 2 ;;
    *) shift ;;
  esac
done
sw=() pt=()
for ((r = 1; r <= rounds; r++)); do
  line=$("$build/bench/bench_step" "${args[@]}" | tee /dev/stderr | tail -1)
  sw+=("$(echo "$line" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')")
  line=$(OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 "$here/torch_step.py" "${torch_args[@]}")
  echo "$line" >&2
  pt+=("$(echo "$line" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')")
done
/usr/bin/python3 - "${sw[*]}" "${pt[*]}" <<'PY'
import sys
sw = [float(x) for x in sys.argv[1].split()]
pt = [float(x) for x in sys.argv[2].split()]
print("round  shardwise tok/s  pytorch tok/s  ratio")
for i, (a, b) in enumerate(zip(sw, pt), 1):
    print(f"{i:5d}  {a:15.1f}  {b:13.1f}  {a / b:5.2f}x")
print(f"best   {max(sw):15.1f}  {max(pt):13.1f}  {max(sw) / max(pt):5.2f}x  (target >= 1.2x)")
PY
