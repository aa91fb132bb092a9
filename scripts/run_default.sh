#!/usr/bin/env bash
# The default job: set up, build, prepare the fortunes corpus (Debian's `fortunes` package, so
# nothing is downloaded), and train the default small GPT (configs/default.json) sharded
# FULL_SHARD across the machine's cores: one rank per core with one thread each, under mpirun.
# It prints the plan the ranks run (shardwise plan), records one step with the profiler (a
# Chrome trace and a memory chart per rank), says where those are and how to run the same job
# on one rank, and prints a sample from the trained model.
#
#   scripts/run_default.sh [--set key=value]...    (RANKS=N overrides the rank count)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
sw=build/tools/shardwise
source scripts/fortunes.sh
prepare_fortunes "$sw"

cfg=configs/default.json
cores=$(nproc)
ranks=${RANKS:-$cores}
threads=$(( cores / ranks > 0 ? cores / ranks : 1 ))
run_dir=runs/default
prof=profile.start_step=100  # a step after warm-up; the profile is written when it ends
echo "---- the plan: $ranks rank(s) x $threads thread(s), FULL_SHARD (shardwise plan $cfg --world-size $ranks) ----"
"$sw" plan "$cfg" --world-size "$ranks" --set threads="$threads"
echo
train=("$sw" train "$cfg" --set threads="$threads" --set profile.enabled=true --set "$prof"
       --set profile.num_steps=1 "$@")
if [ "$ranks" -gt 1 ]; then
  [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  echo "---- training: mpirun -np $ranks ${train[*]} ----"
  mpirun -np "$ranks" --bind-to core "${train[@]}"
else
  echo "---- training: ${train[*]} ----"
  "${train[@]}"
fi
echo
echo "profile of step 100: $run_dir/profile/ (trace_rank<r>.json: open in https://ui.perfetto.dev"
echo "  or chrome://tracing; memory_rank<r>.svg: the memory timeline; peaks_rank<r>.json)"
echo "metrics: $run_dir/metrics.jsonl; weights: $run_dir/hf/ (a Hugging Face model directory)"
echo "on one rank instead: $sw train $cfg --set threads=$cores   (RANKS=1 $0 does that here)"
echo
echo "---- sample (greedy would repeat itself; temperature 0.8, top-k 40) ----"
"$sw" sample --config "$cfg" --weights "$run_dir/hf" \
  --prompt "Q: " --tokens 300 --temperature 0.8 --top-k 40 --seed 1
echo
