#!/usr/bin/env bash
# Issue 38's figures: training across a slow link with HYBRID_SHARD, quantised gradients and
# DiLoCo. Two "hosts" (scripts/netns_hosts.sh: two network namespaces joined by a veth), RPH
# ranks per host (default 2: quantised gradients need a shard group of two or more ranks; 4
# ranks on a 2-core machine are oversubscribed), the link shaped on both ends to $RATE (`netem rate R delay 10ms`, or `tbf rate
# R burst 256kb latency 200ms` where the kernel has no netem: then no added delay); mpirun
# launched as bench/pipeline_link.sh does. The same model, data, seed and global batch (2048
# tokens a step: micro-batch 16 / (2 RPH), seq 128) for $STEPS steps, five ways:
#   hybrid      HYBRID_SHARD, shard_group_size RPH (shard inside a host, all-reduce across)
#   hybrid_q8   the same with zero_quantized_gradients, quantized_bits 8, scope replicate
#               (skipped at RPH 1: not implemented for shard groups of one rank)
#   diloco      local_sgd.sync_every $H (outer Nesterov SGD lr 0.7 momentum 0.9), fragments 1
#   diloco_s    the same, streaming: fragments $FRAGS (one fragment every H / FRAGS steps)
#   diloco_bf16 diloco with outer_dtype bf16
#   hybrid_q4   hybrid_q8 with quantized_bits 4
#   diloco_sd   streaming with the fragment's update landing $DELAY inner steps after its reduce
#               (fragment_sync_delay: the reduction crosses the link while they run) and int8
#               pseudo-gradients with error feedback (outer_dtype int8)
# GPT-2 d_model 256, 8 layers, 4 heads, seq 128, vocab 256 (6.4M parameters), AdamW lr 1e-3,
# threads 1, fortunes data; validation (eval_batches $EVALB) only after the last step. Each run
# under bench/quiet.sh, one at a time. Bytes across the link per step = the veth's rx + tx
# bytes (host b's side) over the whole run / STEPS (start-up and the final evaluation
# included); tokens/s = tokens of steps 2..STEPS / the sum of their step_time_s (the outer
# steps inside); wall = the whole mpirun. The namespaces are removed on exit.
#
#   bench/diloco_link.sh [BUILD_DIR]
#   env: RATE (100mbit), STEPS (50), H (50), FRAGS (2), DELAY (2), MODES (all seven), EVALB (8),
#        RPH (2)
# Output: one line per run and a table with the ratios to hybrid on stdout
# (read in bench/results/diloco_2026-11-29.md).
case "${1:-}" in
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${1:-build}
sw=$(cd "$build/tools" && pwd)/shardwise
rph=${RPH:-2} steps=${STEPS:-50} h=${H:-50} frags=${FRAGS:-2} rate=${RATE:-100mbit} evalb=${EVALB:-8}
source bench/link_common.sh
link_init diloco_link swdl /tmp/sw_diloco_link.XXXXXX
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
source scripts/fortunes.sh
prepare_fortunes "$sw"
cat >"$work/cfg.json" <<EOF
{
  "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 8, "n_head": 4, "d_model": 256,
            "seq_len": 128},
  "data": {"train": "$root/data/fortunes_train.bin", "val": "$root/data/fortunes_val.bin"},
  "train_micro_batch_size_per_gpu": $((8 / rph)), "gradient_accumulation_steps": 1, "train_steps": $steps,
  "eval_every_steps": 0, "eval_batches": $evalb, "log_every_steps": 1, "threads": 1, "seed": 1,
  "optimizer": {"params": {"lr": 0.001}}, "gradient_clipping": 1.0, "comm_timeout_s": 600,
  "sharding_strategy": "HYBRID_SHARD", "shard_group_size": $rph
}
EOF
ls="--set local_sgd.sync_every=$h"
declare -A mode=(
  [hybrid]=""
  [hybrid_q8]="--set zero_optimization.zero_quantized_gradients=true --set zero_optimization.quantized_bits=8 --set zero_optimization.quantized_scope=replicate"
  [diloco]="$ls"
  [diloco_s]="$ls --set local_sgd.fragments=$frags"
  [diloco_bf16]="$ls --set local_sgd.outer_dtype=bf16"
  [hybrid_q4]="--set zero_optimization.zero_quantized_gradients=true --set zero_optimization.quantized_bits=4 --set zero_optimization.quantized_scope=replicate"
  [diloco_sd]="$ls --set local_sgd.fragments=$frags --set local_sgd.fragment_sync_delay=${DELAY:-2} --set local_sgd.outer_dtype=int8")
link_across "$A" tcp,self "$rph" OMP_NUM_THREADS OMP_WAIT_POLICY

echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
netns_down "$prefix" >/dev/null 2>&1 || true
link_up diloco_link "$prefix" "$rate" 256kb delay 10ms limit 10000
echo "## link: $qdisc on both ends of $V; $rph ranks per host, $steps steps, H $h, fragments $frags"
: >"$work/rows"
for m in ${MODES:-hybrid hybrid_q8 hybrid_q4 diloco diloco_s diloco_sd diloco_bf16}; do
  case "$m" in hybrid_q*) if [ "$rph" = 1 ]; then echo "$m: skipped (RPH 1)"; continue; fi ;; esac
  b0=$(link_bytes "$B" "$V")
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  timeout 3600 bench/quiet.sh "${across[@]}" "$sw" train "$work/cfg.json" --quiet --no-export \
    --set run_dir="$work/$m" ${mode[$m]} >"$work/$m.log" 2>&1 ||
    { cat "$work/$m.log" >&2; echo "diloco_link: $m failed" >&2; exit 1; }
  t1=$(date +%s.%N)
  b1=$(link_bytes "$B" "$V")
  python3 - "$work/$m/metrics.jsonl" "$m" "$((b1 - b0))" "$steps" "$(echo "$t1 - $t0" | bc)" \
    "$work/rows" <<'PY'
import json, sys
path, m, b, steps, wall, rows = sys.argv[1:7]
lines = [json.loads(l) for l in open(path)]
st = [l["step_time_s"] for l in lines[1:]]
tok = sum(l["tokens_per_s"] * l["step_time_s"] for l in lines[1:])
val = [l["val_loss"] for l in lines if "val_loss" in l][-1]
per = int(b) / int(steps)
tps = tok / sum(st)
print(f"{m}: link bytes per step {per / 1e6:.3f} MB (run {int(b) / 1e6:.1f} MB), tokens/s {tps:.0f}, "
      f"max step {max(st):.2f} s, wall {float(wall):.1f} s, loss {lines[-1]['loss']:.4f}, val_loss {val:.4f}")
open(rows, "a").write(f"{m} {per} {tps} {val} {wall}\n")
PY
done
python3 - "$work/rows" <<'PY'
import sys
r = {l.split()[0]: [float(x) for x in l.split()[1:]] for l in open(sys.argv[1])}
print("| run | MB across the link per step | tokens/s | wall s | final val_loss | bytes: hybrid / run | speed: run / hybrid | val_loss vs hybrid |")
print("|---|--:|--:|--:|--:|--:|--:|--:|")
base = r.get("hybrid")
for m, (b, t, v, w) in r.items():
    ratio = f"{base[0] / b:.1f}x | {t / base[1]:.2f}x | {100 * (v / base[2] - 1):+.2f}%" if base else "- | - | -"
    print(f"| {m} | {b / 1e6:.3f} | {t:.0f} | {w:.1f} | {v:.4f} | {ratio} |")
PY
netns_down "$prefix" >/dev/null 2>&1 || true
