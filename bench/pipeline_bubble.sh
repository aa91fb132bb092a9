#!/usr/bin/env bash
# Pipeline bubble and per-stage peak memory (issue 37), from the profiler of `shardwise train`:
# GPT-2 d_model 256, 8 layers, 4 heads, seq 128, micro-batch 2, vocab 256 (fortunes bytes),
# threads 1 per rank, one rank per stage, 3 steps with steps 2 and 3 profiled, no checkpointing.
# For each P in $PS, M in $MS and schedule (GPipe, 1F1B, Interleaved1F1B V=2,
# InterleavedZeroBubble V=1 and V=2), one run under bench/quiet.sh (never two at once), then
# bench/pipeline_bubble.py on its traces (measured wall bubble, the replayed compute-action
# bubble, theory) and, per rank, the profiled peak (peaks_rank<r>.json) against the trainer's
# plan of the same step (plan_rank<r>.json) and `shardwise plan --json`'s device peak of that
# pipeline rank (the CLI's per-stage prediction, kernel workspace included).
#
#   bench/pipeline_bubble.sh [BUILD_DIR]
#   env: PS ("2 4"), MS ("4 8"), SCHEDS (all five as NAME:V), KEEP (unset: run dirs removed)
# Output: a "bubble" JSON line and a "memory" line per rank for each run, on stdout. P = 4 runs
# 4 ranks on this machine's 2 cores: read its replay column, not the wall one.
case "${1:-}" in
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sw=$build/tools/shardwise
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
work=$(mktemp -d /tmp/sw_pipe_bubble.XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
source scripts/fortunes.sh
prepare_fortunes "$sw"
cat >"$work/cfg.json" <<'EOF'
{
  "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 8, "n_head": 4, "d_model": 256,
            "seq_len": 128},
  "data": {"train": "data/fortunes_train.bin", "val": "data/fortunes_val.bin"},
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8, "train_steps": 3,
  "eval_every_steps": 0, "eval_batches": 1, "log_every_steps": 1, "threads": 1, "seed": 1,
  "optimizer": {"params": {"lr": 0.001}}, "gradient_clipping": 1.0,
  "profile": {"enabled": true, "start_step": 2, "num_steps": 2}
}
EOF
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
for P in ${PS:-2 4}; do
  for M in ${MS:-4 8}; do
    for sv in ${SCHEDS:-GPipe:1 1F1B:1 Interleaved1F1B:2 InterleavedZeroBubble:1 InterleavedZeroBubble:2}; do
      s=${sv%:*} V=${sv#*:}
      run="$work/p${P}_m${M}_${s}_v${V}"
      bench/quiet.sh mpirun --oversubscribe --bind-to none -np "$P" "$sw" train "$work/cfg.json" \
        --no-export --quiet --set run_dir="$run" --set gradient_accumulation_steps="$M" \
        --set parallelism.pipeline_parallel_degree="$P" \
        --set parallelism.pipeline_parallel_schedule="$s" \
        --set parallelism.pipeline_parallel_virtual_stages="$V" >"$run.log" 2>&1 ||
        { cat "$run.log"; echo "pipeline_bubble: $run failed"; exit 1; }
      bounds=$(sed -n 's/.*stage bounds (schedule positions) //p' "$run.log" | head -1)
      "$sw" plan "$work/cfg.json" --world-size "$P" --json --set gradient_accumulation_steps="$M" \
        --set parallelism.pipeline_parallel_degree="$P" \
        --set parallelism.pipeline_parallel_schedule="$s" \
        --set parallelism.pipeline_parallel_virtual_stages="$V" >"$run.plan.json" 2>"$run.plan.err" ||
        echo '{}' >"$run.plan.json"
      echo -n "bubble "
      python3 bench/pipeline_bubble.py "$run/profile" --P "$P" --V "$V" --M "$M" --schedule "$s" \
        --bounds "$bounds"
      python3 - "$run" "$P" "$M" "$s" "$V" <<'PY'
import json, sys
run, P, M, s, V = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
tok = [json.loads(l)["tokens_per_s"] for l in open(f"{run}/metrics.jsonl")][1:]
for r in range(P):
    meas = json.load(open(f"{run}/profile/peaks_rank{r}.json"))
    plan = json.load(open(f"{run}/profile/plan_rank{r}.json"))
    err = plan["peak_bytes"] / meas["peak_bytes"] - 1
    try:  # `shardwise plan --json`: the device tier of pipeline rank r (kernel workspace in)
        cli = [x for x in json.load(open(f"{run}.plan.json"))["ranks"] if x["rank"] == r][0]
        cli = cli["tiers"]["device"]["peak_bytes"]
        cli_s = f"plan CLI {cli} error {100 * (cli / meas['peak_bytes'] - 1):+.2f}% "
    except (KeyError, IndexError):
        cli_s = "plan CLI - "
    print(f"memory P={P} M={M} {s} V={V} rank {r}: measured {meas['peak_bytes']} "
          f"(activations {meas['at_peak']['activations']}) predicted {plan['peak_bytes']} "
          f"(activations {plan['at_peak']['activations']}) error {100 * err:+.2f}% " + cli_s +
          f"tokens/s {min(tok):.0f}-{max(tok):.0f}")
PY
    done
  done
done
