#!/usr/bin/env bash
# Pipeline across a slow link (issue 37): two "hosts" (scripts/netns_hosts.sh, two network
# namespaces on this machine joined by a veth), the link shaped on both ends by tc to each rate
# in $RATES (`netem rate R limit 10000`, or `tbf rate R burst B latency 200ms` where the kernel
# has no netem), one rank per host, every byte between them over TCP on the veth. The same
# model and global batch (2048 tokens a step) three ways:
#   pipe     2 stages, one per host (parallelism.pipeline_parallel_degree 2, 1F1B, micro-batch
#            2, 8 micro-batches): only activations, their gradients and the tied embedding's
#            gradients cross
#   full     FULL_SHARD over both ranks (micro-batch 8, 1 micro-step a rank): parameters
#            gathered for forward and backward, gradients reduce-scattered, every step
#   hybrid   HYBRID_SHARD, shard_group_size 1 (shard inside a host, one rank per host:
#            replicate across; micro-batch 8): gradients all-reduced across the link
# GPT-2 d_model 256, 8 layers, seq 128, vocab 256 (6.4M parameters, 25.7 MB fp32), threads 1,
# fortunes data, no validation but the last step's, no export. Each run twice, STEPS and 1
# steps, under bench/quiet.sh (one at a time); bytes across the link per step = the difference
# of the veth's rx + tx bytes (host b's side) between the two runs / (STEPS - 1), so start-up
# and the final evaluation cancel; tokens/s = median of metrics.jsonl's steps 2..STEPS.
# RPH=2: two ranks per host (4 ranks on this machine's 2 cores: oversubscribed, so the bytes
# hold but tokens/s only where the link dominates): pipe is 2 stages x FULL_SHARD 2 inside a
# host (4 micro-batches of 2 a data rank), full is FULL_SHARD over 4 and hybrid shard_group_size
# 2 (micro-batch 4 each). The namespaces are removed on exit (also on error or Ctrl-C);
# re-runnable.
#
#   bench/pipeline_link.sh [BUILD_DIR]
#   env: RATES ("1gbit 100mbit"), STEPS (4), MODES ("pipe full hybrid"), RPH (1)
# Output: one line per run on stdout (read in bench/results/pipeline_2026-11-29.md).
case "${1:-}" in
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${1:-build}
sw=$(cd "$build/tools" && pwd)/shardwise
steps=${STEPS:-4}
source bench/link_common.sh
link_init pipeline_link swpl /tmp/sw_pipe_link.XXXXXX
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
source scripts/fortunes.sh
prepare_fortunes "$sw"
cat >"$work/cfg.json" <<EOF
{
  "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 8, "n_head": 4, "d_model": 256,
            "seq_len": 128},
  "data": {"train": "$root/data/fortunes_train.bin", "val": "$root/data/fortunes_val.bin"},
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8, "train_steps": 4,
  "eval_every_steps": 0, "eval_batches": 1, "log_every_steps": 1, "threads": 1, "seed": 1,
  "optimizer": {"params": {"lr": 0.001}}, "gradient_clipping": 1.0, "comm_timeout_s": 300
}
EOF
rph=${RPH:-1}  # ranks per host
if [ "$rph" = 1 ]; then
  declare -A mode=(
    [pipe]="--set parallelism.pipeline_parallel_degree=2 --set parallelism.pipeline_parallel_schedule=1F1B"
    [full]="--set sharding_strategy=FULL_SHARD --set train_micro_batch_size_per_gpu=8 --set gradient_accumulation_steps=1"
    [hybrid]="--set sharding_strategy=HYBRID_SHARD --set shard_group_size=1 --set train_micro_batch_size_per_gpu=8 --set gradient_accumulation_steps=1")
else  # 2: stage s on host s, FULL_SHARD inside it; the global batch stays 2048 tokens
  declare -A mode=(
    [pipe]="--set parallelism.pipeline_parallel_degree=2 --set parallelism.pipeline_parallel_schedule=1F1B --set sharding_strategy=FULL_SHARD --set gradient_accumulation_steps=4"
    [full]="--set sharding_strategy=FULL_SHARD --set train_micro_batch_size_per_gpu=4 --set gradient_accumulation_steps=1"
    [hybrid]="--set sharding_strategy=HYBRID_SHARD --set shard_group_size=2 --set train_micro_batch_size_per_gpu=4 --set gradient_accumulation_steps=1")
fi
link_across "$A" tcp,self "$rph" OMP_NUM_THREADS OMP_WAIT_POLICY
run_once() {  # name n_steps overrides...: prints the link bytes the run moved
  local name=$1 n=$2
  shift 2
  local b0 b1
  b0=$(link_bytes "$B" "$V")
  # shellcheck disable=SC2068
  timeout 600 bench/quiet.sh "${across[@]}" "$sw" train "$work/cfg.json" --quiet --no-export \
    --set run_dir="$work/$name" --set train_steps="$n" $@ >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log" >&2; echo "pipeline_link: $name failed" >&2; return 1; }
  b1=$(link_bytes "$B" "$V")
  echo $((b1 - b0))
}

echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
for rate in ${RATES:-1gbit 100mbit}; do
  netns_down "$prefix" >/dev/null 2>&1 || true
  burst=$([ "$rate" = 1gbit ] && echo 1mb || echo 256kb)
  link_up pipeline_link "$prefix" "$rate" "$burst" limit 10000
  echo "## link: $qdisc on both ends of $V"
  for m in ${MODES:-pipe full hybrid}; do
    # shellcheck disable=SC2086
    long=$(run_once "${m}_${rate}_long" "$steps" ${mode[$m]})
    # shellcheck disable=SC2086
    short=$(run_once "${m}_${rate}_short" 1 ${mode[$m]})
    python3 - "$work/${m}_${rate}_long/metrics.jsonl" "$m" "$rate" "$long" "$short" "$steps" "$rph" <<'PY'
import json, statistics, sys
path, m, rate, long_b, short_b, steps = sys.argv[1:7]
lines = [json.loads(l) for l in open(path)]
tok = [l["tokens_per_s"] for l in lines[1:]]
st = [l["step_time_s"] for l in lines[1:]]
per = (int(long_b) - int(short_b)) / (int(steps) - 1)
print(f"{rate} {m} ({sys.argv[7]} ranks per host): tokens/s {statistics.median(tok):.0f} (steps 2..{steps}: "
      f"{' '.join(f'{t:.0f}' for t in tok)}), step {statistics.median(st):.3f} s, link bytes per "
      f"step {per / 1e6:.2f} MB (runs: {int(long_b) / 1e6:.1f} MB {steps} steps, "
      f"{int(short_b) / 1e6:.1f} MB 1 step), loss {lines[-1]['loss']:.4f}")
PY
  done
  netns_down "$prefix" >/dev/null 2>&1 || true
done
