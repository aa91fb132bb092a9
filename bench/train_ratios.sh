#!/usr/bin/env bash
# Issue 9's step targets, timed the way users run: `shardwise train` (the trainer loop, data,
# metrics), GPT-2 124M shape (12 layers, d 768, 12 heads, vocab 50304, T 256, micro-batch 4),
# side by side in one run, alternating, ROUNDS rounds, each figure beside the limit measured
# in the same run:
#   fp32   1 rank x 2 threads            vs sgemm at the model's GEMM shapes (bench_step
#                                          --sgemm-only): the roofline fraction (target >= 0.88)
#   shard  FULL_SHARD 2 ranks x 1 thread vs fp32 1 x 2 (target >= 1)
#   bf16   1 rank x 2 threads, bf16     vs fp32 (target >= 2 on CPUs with fast bf16 dot
#                                          products, >= 0.95 elsewhere) and vs the best bf16
#                                          GEMM rate over the model's shapes (the fastest path's
#                                          total in bench_gemm_bf16 or, on 16-bit operands,
#                                          bench_gemm16; target >= 0.9)
#   trace  configs/default.json, TRACE_STEPS steps, the profile block recording every step vs
#          off (target: tracing costs <= 2%)
# tokens/s of a run = median over its steps after WARMUP (metrics.jsonl). Training FLOPs per
# token = 6 * params + 12 * layers * d_model * T (bench_step's convention).
#
#   bench/train_ratios.sh [BUILD_DIR]      env: ROUNDS (2), STEPS (8), WARMUP (3), TRACE_STEPS (300)
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sw=$build/tools/shardwise
rounds=${ROUNDS:-2} steps=${STEPS:-8} warmup=${WARMUP:-3} trace_steps=${TRACE_STEPS:-300}
py=/usr/bin/python3
work=$(mktemp -d /tmp/sw_train_ratios.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
mpirun=(mpirun --allow-run-as-root --oversubscribe -x OMP_WAIT_POLICY -x OMPI_MCA_mpi_yield_when_idle=1)

source scripts/fortunes.sh
prepare_fortunes "$sw"
# The 124M shape (configs/gpt2_124m.json), STEPS steps, no validation.
big=(configs/gpt2_124m.json --set train_steps="$steps" --set data.val=)

# median tokens/s of the steps after WARMUP of run dir $1
tps() {
  $py - "$1/metrics.jsonl" "$warmup" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
print("%.3f" % statistics.median(r["tokens_per_s"] for r in rows[int(sys.argv[2]):]))
PY
}
run() {  # name, command...
  local name=$1
  shift
  rm -rf "$work/$name"
  "$@" --quiet --no-export --set run_dir="$work/$name" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log" >&2; echo "train_ratios: $name failed" >&2; exit 1; }
  tps "$work/$name"
}

declare -A sum
results=()
for r in $(seq 1 "$rounds"); do
  roof=$($build/bench/bench_step --sgemm-only --layers 12 --d 768 --heads 12 --vocab 50304 \
         --T 256 --B 4 --threads 2)
  bf16_limit=$($build/bench/bench_gemm_bf16 --threads 2 --reps 3 --rows 1024 |
               $py -c '
import sys
lines = sys.stdin.read().splitlines()
hdr = next(l for l in lines if l.startswith("GFLOP/s")).split()
tot = next(l for l in lines if l.startswith("total")).split()
vals = dict(zip(hdr[-16:], tot[-15:]))
best = max(float(vals[k]) for k in ("fused", "native", "onednn", "auto"))
print("%.3f %.3f" % (best, float(vals["sgemm"])))')
  # The step's own products read 16-bit operands in place (gemm_bf16_16): their rate over the
  # same shapes, own kernels or oneDNN, is a limit too (bench_gemm16; AVX512-BF16 CPUs only).
  bf16_limit=$($build/bench/bench_gemm16 --threads 2 --reps 3 --rows 1024 --d 768 --vocab 50304 |
               $py -c '
import sys
best, sgemm = map(float, sys.argv[1].split())
tot = [l.split() for l in sys.stdin.read().splitlines() if l.startswith("total")]
if tot: best = max(best, float(tot[0][1]), float(tot[0][2]))
print("%.3f %.3f" % (best, sgemm))' "$bf16_limit")
  fp32=$(run fp32 "$sw" train "${big[@]}" --set threads=2)
  shard=$(run shard "${mpirun[@]}" -np 2 "$sw" train "${big[@]}" --set threads=1)
  bf16=$(run bf16 "$sw" train "${big[@]}" --set threads=2 --set bf16.enabled=true)
  trace_off=$(run trace_off "$sw" train configs/default.json --set train_steps="$trace_steps" \
              --set eval_every_steps=0 --set data.val= --set scheduler.params.warmup_num_steps=10)
  trace_on=$(run trace_on "$sw" train configs/default.json --set train_steps="$trace_steps" \
             --set eval_every_steps=0 --set data.val= --set scheduler.params.warmup_num_steps=10 \
             --set profile.enabled=true \
             --set profile.start_step=1 --set profile.num_steps="$trace_steps" \
             --set profile.out="$work/prof")
  results+=("$($py - "$roof" "$bf16_limit" "$fp32" "$shard" "$bf16" "$trace_off" "$trace_on" "$r" <<'PY'
import json, sys
roof = json.loads(sys.argv[1]); best_bf16, sgemm2 = map(float, sys.argv[2].split())
fp32, shard, bf16, off, on = map(float, sys.argv[3:8])
fpt = roof["flops_per_token"]
print(("round %s: fp32 %.1f tok/s = %.2f of sgemm (%.1f GFLOP/s) | FULL_SHARD 2x1 %.1f tok/s = "
       "%.2fx 1x2 | bf16 %.1f tok/s = %.2fx fp32, %.2f of the best bf16 GEMM rate (%.1f GFLOP/s) | "
       "tracing on/off %.3f (%.0f vs %.0f tok/s)") % (
    sys.argv[8], fp32, fp32 * fpt / 1e9 / roof["sgemm_gflops"], roof["sgemm_gflops"], shard,
    shard / fp32, bf16, bf16 / fp32, bf16 * fpt / 1e9 / best_bf16, best_bf16, on / off, on, off))
PY
)")
  echo "${results[-1]}"
done
