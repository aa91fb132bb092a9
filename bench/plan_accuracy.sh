#!/usr/bin/env bash
# The planner's step-time prediction against `shardwise train`, per configuration: the
# predicted step (`shardwise plan --json` with a profile calibrated on this machine at that
# rank count and shapes, `shardwise plan --calibrate`) beside the measured step times of
# STEPS steps (metrics.jsonl, the first step dropped), min and median, and their ratio
# predicted / measured (< 1: the plan under-estimates). Calibration and measurement of a row run
# back to back, and the load average is printed with each row: on a shared machine both drift.
# Beside it the device memory: the plan's peak plus the kernel-workspace estimate (`plan
# --json`) against the run's tracked peak (peak_mem_bytes), and their ratio.
#
#   bench/plan_accuracy.sh [BUILD_DIR] [ROWS...]
#   env: STEPS (5), NVME_DIR (a directory for the NVMe rows; default: skipped)
# ROWS: row names to run (default all). Output: a table on stdout; files in a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
sw=$build/tools/shardwise
steps=${STEPS:-5}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
mpirun=(mpirun --oversubscribe --bind-to none)
work=$(mktemp -d /tmp/sw_plan_accuracy.XXXXXX)
trap 'rm -rf "$work"' EXIT
source scripts/fortunes.sh
prepare_fortunes "$sw"

# Small shapes that train in seconds per step on 2 cores, plus GPT-2 124M.
cat >"$work/gpt2s.json" <<'EOF'
{"model": {"type": "gpt2", "vocab_size": 50304, "n_layer": 4, "n_head": 6, "d_model": 384,
           "seq_len": 256},
 "data": {"train": "data/fortunes_train.bin"}, "train_micro_batch_size_per_gpu": 4,
 "gradient_accumulation_steps": 1, "train_steps": 100, "zero_optimization": {"stage": 3}}
EOF
cat >"$work/llamas.json" <<'EOF'
{"model": {"type": "llama", "vocab_size": 32000, "n_layer": 4, "n_head": 6, "n_kv_head": 2,
           "d_model": 384, "seq_len": 256},
 "data": {"train": "data/fortunes_train.bin"}, "train_micro_batch_size_per_gpu": 4,
 "gradient_accumulation_steps": 1, "train_steps": 100, "zero_optimization": {"stage": 3}}
EOF
cp configs/gpt2_124m.json "$work/gpt2_124m.json"
sed -i 's/"val": "data\/fortunes_val.bin"//; s/, *}/}/' "$work/gpt2_124m.json"

# name | config | ranks | overrides (space-separated --set values)
rows=(
  "gpt2s-np1-off|gpt2s|1|"
  "gpt2s-np1-full|gpt2s|1|activation_checkpointing=\"full\""
  "gpt2s-np1-sel|gpt2s|1|activation_checkpointing=\"selective\""
  "gpt2s-np1-acc2|gpt2s|1|train_micro_batch_size_per_gpu=2 gradient_accumulation_steps=2"
  "gpt2s-np1-bf16|gpt2s|1|bf16.enabled=true"
  "gpt2s-np2-z3|gpt2s|2|"
  "gpt2s-np2-z2|gpt2s|2|zero_optimization.stage=2"
  "gpt2s-np2-z0|gpt2s|2|zero_optimization.stage=0"
  "gpt2s-np2-z1-full|gpt2s|2|zero_optimization.stage=1 activation_checkpointing=\"full\""
  "gpt2s-np2-z3-bpu2|gpt2s|2|blocks_per_unit=2"
  "llamas-np1-off|llamas|1|"
  "llamas-np2-z3-sel|llamas|2|activation_checkpointing=\"selective\""
  "llamas-np2-z3-acc2|llamas|2|train_micro_batch_size_per_gpu=2 gradient_accumulation_steps=2"
  "gpt2_124m-np1|gpt2_124m|1|"
)
if [ -n "${NVME_DIR:-}" ]; then
  rows+=("gpt2s-np1-optnvme|gpt2s|1|zero_optimization.offload_optimizer.device=\"nvme\" zero_optimization.offload_optimizer.nvme_path=\"$NVME_DIR\"")
fi
want=("$@")

printf "%-20s %5s %10s %10s %10s %7s %7s %6s %9s %9s %6s\n" row ranks predicted meas_min meas_med \
  p/min p/med load mem_MiB meas_MiB p/m
for row in "${rows[@]}"; do
  IFS='|' read -r name cfg np ov <<<"$row"
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $name "* ]]; then continue; fi
  sets=()
  for kv in $ov; do sets+=(--set "$kv"); done
  launch=()
  [ "$np" -gt 1 ] && launch=("${mpirun[@]}" -np "$np")
  # Calibrated for this shape (micro-batch) and rank count, right before the run.
  hw="$work/hw_${name}.json"
  "${launch[@]}" "$sw" plan "$work/$cfg.json" "${sets[@]}" --calibrate --out-hardware "$hw" \
    >"$work/cal_$name.log" 2>&1 || { cat "$work/cal_$name.log"; exit 1; }
  read -r pred pmem <<<"$("$sw" plan "$work/$cfg.json" "${sets[@]}" --world-size "$np" --hardware "$hw" --json |
         python3 -c 'import json,sys; j = json.load(sys.stdin); r = j["ranks"][0]
print(j["step_time"]["step_time_s"], r["tiers"]["device"]["peak_bytes"] + r["kernel_workspace_bytes"])')"
  rm -rf "$work/run_$name"
  "${launch[@]}" "$sw" train "$work/$cfg.json" "${sets[@]}" --set train_steps="$steps" \
    --set run_dir="\"$work/run_$name\"" --set eval_every_steps=0 >"$work/train_$name.log" 2>&1 ||
    { cat "$work/train_$name.log"; exit 1; }
  read -r mmin mmed mmem <<<"$(python3 - "$work/run_$name/metrics.jsonl" <<'PY'
import json, sys, statistics
m = [json.loads(l) for l in open(sys.argv[1]) if '"step_time_s"' in l]
t = [x["step_time_s"] for x in m][1:]
print(min(t), statistics.median(t), max(x["peak_mem_bytes"] for x in m))
PY
)"
  load=$(cut -d' ' -f1 /proc/loadavg)
  python3 - "$name" "$np" "$pred" "$mmin" "$mmed" "$load" "$pmem" "$mmem" <<'PY'
import sys
n, np_, p, a, m, l, pm, mm = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:])
print("%-20s %5s %9.3fs %9.3fs %9.3fs %7.2f %7.2f %6.2f %9.1f %9.1f %6.3f" %
      (n, np_, p, a, m, p / a, p / m, l, pm / 2**20, mm / 2**20, pm / mm))
PY
done
