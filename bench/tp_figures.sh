#!/usr/bin/env bash
# Tensor parallelism's figures (issue 36) at GPT-2 124M's shape, T 1024, micro-batch 1, one
# thread per rank, 2 ranks: tensor 2 (parallelism.tensor_parallel_degree 2) against FULL_SHARD 2.
#   1. bench_tensor_parallel (mpirun -np 2): per rank the tracked peak and each category's peak,
#      and the bytes the tensor and data groups move per step (Group::stats) against the step
#      plan's sum by queue and the bench's own formula.
#   2. `shardwise plan --json`: the predicted device peak and its categories (planner error
#      against 1.'s measured peak, which is what metrics.jsonl's peak_mem_bytes reports).
#   3. `shardwise plan-dump`: the bytes its listed actions move, summed by queue.
#   4. Step time: `shardwise train` (2 steps, --no-export, data/fortunes_train.bin, no
#      validation) under bench/quiet.sh, the two configurations alternated REPS times, never two
#      at once; each run's step_time_s and peak_mem_bytes from metrics.jsonl.
#
#   bench/tp_figures.sh [BUILD_DIR]
#   env: REPS (2) timing rounds; PARTS (1234) which parts to run
# Output: each part's raw lines on stdout (read in bench/results/tensor_parallel_2026-11-29.md).
case "${1:-}" in
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sw=$build/tools/shardwise
bench=$build/bench/bench_tensor_parallel
reps=${REPS:-2}
parts=${PARTS:-1234}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
mpirun=(mpirun --oversubscribe --bind-to none -np 2)
work=$(mktemp -d /tmp/sw_tp_figures.XXXXXX)
trap 'rm -rf "$work"' EXIT
source scripts/fortunes.sh
prepare_fortunes "$sw"

cfg=configs/gpt2_124m.json
common=(--set model.seq_len=1024 --set train_micro_batch_size_per_gpu=1 --set threads=1)
declare -A mode=([tp2]="--set parallelism.tensor_parallel_degree=2" [fs2]="")
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ $parts == *1* ]]; then
  echo "## 1. bench_tensor_parallel"
  for t in 2 1; do
    "${mpirun[@]}" "$bench" --tensor "$t" --T 1024 --B 1 --steps 2 --threads 1 \
      --data data/fortunes_train.bin | grep '^{' | sort >"$work/bench_t$t.jsonl"
    cat "$work/bench_t$t.jsonl"
  done
fi

if [[ $parts == *2* ]]; then
  echo "## 2. shardwise plan --json (device tier, rank 0)"
  for m in tp2 fs2; do
    # shellcheck disable=SC2086
    "$sw" plan "$cfg" --world-size 2 "${common[@]}" ${mode[$m]} --json >"$work/plan_$m.json"
    python3 - "$work/plan_$m.json" "$m" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))["ranks"][0]["tiers"]["device"]
print(sys.argv[2], "predicted", d["peak_bytes"], "at", d["action"], "categories", d["categories"])
EOF
  done
fi

if [[ $parts == *3* ]]; then
  echo "## 3. shardwise plan-dump: bytes moved, by queue"
  for m in tp2 fs2; do
    # shellcheck disable=SC2086
    "$sw" plan-dump "$cfg" --world-size 2 "${common[@]}" ${mode[$m]} >"$work/dump_$m.txt"
    head -1 "$work/dump_$m.txt" | sed "s/^/$m: /"
    awk -v m="$m" '/ moves / {
        for (i = 1; i <= NF; ++i) if ($i == "moves") { u = $(i + 2); f = 1
          if (u == "GiB") f = 1073741824; if (u == "MiB") f = 1048576; if (u == "KiB") f = 1024
          s[$2] += $(i + 1) * f } }
      END {for (q in s) printf "%s %s %.0f bytes (from MiB rounded to 0.01)\n", m, q, s[q]}' \
      "$work/dump_$m.txt" | sort
  done
fi

if [[ $parts == *4* ]]; then
  echo "## 4. shardwise train, 2 steps, alternated ($reps rounds, bench/quiet.sh)"
  for ((k = 1; k <= reps; ++k)); do
    for m in tp2 fs2; do
      run=$work/run_${m}_$k
      # shellcheck disable=SC2086
      bench/quiet.sh "${mpirun[@]}" "$sw" train "$cfg" --no-export --quiet "${common[@]}" \
        ${mode[$m]} --set train_steps=2 --set 'data.val=""' --set "run_dir=$run" \
        >"$work/train_${m}_$k.log" 2>&1 || { cat "$work/train_${m}_$k.log"; exit 1; }
      python3 - "$run/metrics.jsonl" "$m" "$k" "$(cut -d' ' -f1 /proc/loadavg)" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(sys.argv[2], "round", sys.argv[3], "step_time_s",
      [round(r["step_time_s"], 3) for r in rows], "peak_mem_bytes",
      [r["peak_mem_bytes"] for r in rows], "comm_s", [round(r["comm_s"], 3) for r in rows],
      "exposed_comm_s", [round(r["exposed_comm_s"], 3) for r in rows], "load", sys.argv[4])
EOF
    done
  done
fi
