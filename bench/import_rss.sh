#!/usr/bin/env bash
# Issue 35's import memory target: a 2-rank import of a 7B-shaped Hugging Face directory holds
# at most one tensor beyond the rank's shards. bench_import writes a LlamaForCausalLM directory
# with Llama-2-7B widths (d 4096, d_ff 11008, 32 heads, vocab 32000; LAYERS blocks, default 2,
# so that two ranks' shards, gradients and AdamW moments fit a 24 GiB machine) in BF16 with our
# SafeTensorsWriter, then each of 2 ranks imports it and prints its RSS before, its peak during
# the import (VmHWM after /proc/self/clear_refs), its fp32 shard and the largest tensor.
# Measured 2026-11-29 (2 layers: 0.67 B parameters, 1.24 GiB bf16; 2 ranks, FULL_SHARD): each
# rank 4.99 GiB before the import (its fp32 shard of 1.24 GiB x 4: parameters, gradients, AdamW
# moments), 5.48 GiB at the import's peak: +0.488 GiB = the largest tensor (embed_tokens or
# lm_head, 32000 x 4096 fp32); rank 0 read 17 of 21 tensors, rank 1 8.
#
#   bench/import_rss.sh [DIR] [BUILD_DIR]      env: LAYERS (2), NP (2)
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${1:-}" ]; then dir=$1; else dir=$(mktemp -d /tmp/sw_import_rss.XXXXXX); trap 'rm -rf "$dir"' EXIT; fi
build=${2:-build}
layers=${LAYERS:-2} np=${NP:-2}
"$build/bench/bench_import" write "$dir" --layers "$layers"
flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
OMP_NUM_THREADS=1 mpirun "${flags[@]}" -np "$np" "$build/bench/bench_import" import "$dir"
