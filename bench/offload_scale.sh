#!/usr/bin/env bash
# Issue 10's scale figure: configs/llama_4b_nvme.json (Llama, d 3072, 40 layers, 24/8 heads,
# d_ff 8192, vocab 32000: 4.22B parameters; T=128, micro-batch 1, bf16, full activation
# checkpointing; parameters, gradients and AdamW state on NVMe under DIR) trained for 3 steps
# on 2 ranks x 1 thread. Prints each rank's peak resident set (GNU time), the NVMe files' size
# (sampled while they exist) beside `shardwise plan`'s prediction, and the step times. Takes
# about half an hour on a 2-core VM with a ~1 GB/s disk (every step moves ~80 GB per rank).
#   bench/offload_scale.sh DIR [BUILD_DIR]
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: bench/offload_scale.sh DIR [BUILD_DIR]}
build=${2:-build}
sw=$(realpath "$build/tools/shardwise")
work=$(mktemp -d /tmp/sw_scale.XXXXXX)
trap 'rm -rf "$work"; [ -n "${sampler:-}" ] && kill $sampler 2>/dev/null || true' EXIT
source scripts/fortunes.sh
prepare_fortunes "$sw"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
set_dir=(--set zero_optimization.offload_param.nvme_path="$dir/nvme"
         --set zero_optimization.offload_optimizer.nvme_path="$dir/nvme" --set run_dir="$work/run")
"$sw" plan configs/llama_4b_nvme.json --world-size 2 "${set_dir[@]}"
( while sleep 10; do du -sb "$dir/nvme" 2>/dev/null | cut -f1; done ) > "$work/du.txt" &
sampler=$!
mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 /usr/bin/time -f "rank peak RSS %M KiB, wall %e s" \
  "$sw" train configs/llama_4b_nvme.json --no-export --set data.val= "${set_dir[@]}"
kill $sampler; sampler=
echo "NVMe files at most: $(sort -n "$work/du.txt" | tail -1) bytes"
/usr/bin/python3 -c "
import json
for l in open('$work/run/metrics.jsonl'):
    m = json.loads(l)
    print(f\"step {m['step']}: loss {m['loss']:.4f}, {m['step_time_s']:.1f} s, rank 0 RSS {m['rss_bytes'] / 2**30:.2f} GiB\")"
