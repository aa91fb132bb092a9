#!/usr/bin/env bash
# Peak RSS per rank of the end-of-run export against training's (issue 35): a ~0.29B Llama
# (vocabulary 32000, 20 layers of width 1024, GQA 16/4, untied) trained 2 steps on 2 ranks
# with parameters and optimizer state on NVMe, once with --no-export (training's peak) and once
# exporting (the whole run's peak); each rank's peak is /usr/bin/time's maximum RSS. Prints per
# rank both peaks and the ratio run-with-export / training. A ratio near 1 means the export
# holds nothing beyond training (the streaming export: one unit at a time, each rank its own
# files); the old export gathered the whole model on rank 0.
#
#   bench/export_rss.sh [SHARDWISE] [WORK_DIR]
#       (defaults: build/tools/shardwise, /tmp/sw_export_rss)
# EXPORT_ARGS: more arguments of the exporting run, e.g. "--set checkpoint.export_shard_bytes=
# 300000000" to cut the weights into 4 files, 2 written by each rank.
# Needs data/fortunes_train.bin (scripts/run_default.sh prepares it) and ~6 GB free in WORK_DIR.
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
sw=$(realpath "${1:-build/tools/shardwise}")
work=${2:-/tmp/sw_export_rss}
rm -rf "$work" && mkdir -p "$work/nvme"
cat >"$work/cfg.json" <<EOF
{
  "model": {"type": "llama", "vocab_size": 32000, "n_layer": 20, "n_head": 16, "n_kv_head": 4,
            "d_model": 1024, "d_ff": 2816, "seq_len": 128, "tie_embeddings": false},
  "data": {"train": "$PWD/data/fortunes_train.bin"},
  "train_micro_batch_size_per_gpu": 1,
  "train_steps": 2,
  "scheduler": {"type": "Constant", "params": {}},
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
  "activation_checkpointing": "full",
  "zero_optimization": {
    "stage": 3,
    "offload_param": {"device": "nvme", "nvme_path": "$work/nvme", "buffer_count": 2},
    "offload_optimizer": {"device": "nvme", "nvme_path": "$work/nvme", "buffer_count": 4}
  },
  "run_dir": "$work/run"
}
EOF
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() {  # run NAME ARGS...: each rank's max RSS (KiB) into $work/NAME.<rank>
  local name=$1
  shift
  mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS=1 bash -c \
    '/usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$work/$name" \
    "$sw" train "$work/cfg.json" --quiet "$@" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; exit 1; }
}
run train --no-export
run export ${EXPORT_ARGS:-}
printf "%-6s %16s %16s %8s\n" rank "training MiB" "with export MiB" ratio
for r in 0 1; do
  t=$(tail -1 "$work/train.$r") e=$(tail -1 "$work/export.$r")
  printf "%-6s %16d %16d %8.2f\n" "$r" $((t / 1024)) $((e / 1024)) "$(echo "$e / $t" | bc -l)"
done
ls "$work/run/hf" "$work/run" 2>/dev/null | tr '\n' ' '
echo
