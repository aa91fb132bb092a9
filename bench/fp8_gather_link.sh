#!/usr/bin/env bash
# fp8.all_gather across a slow link (issue 39, point 3): two "hosts" (scripts/netns_hosts.sh),
# one rank each, FULL_SHARD over both (every parameter gather crosses the link), the link shaped
# on both ends to $RATE as bench/diloco_link.sh does. The same bf16 + fp8 training (current
# recipe, power-of-two scales) twice: the bf16 gather, then fp8.all_gather (Linear weights as
# E4M3 bytes, sharding/unit_state.h). The two must give the same losses bit for bit (checked
# here: the run fails otherwise); the figures are the bytes across the link per step (the
# veth's rx + tx on host b, start-up included, / STEPS) and tokens/s (steps 2..STEPS).
# GPT-2 d_model 256, 8 layers, 4 heads, seq 128, vocab 256, micro-batch 4 a rank, threads 1,
# fortunes data. Each run under bench/quiet.sh, one at a time.
#
#   bench/fp8_gather_link.sh [BUILD_DIR]
#   env: RATE (100mbit), STEPS (20)
# Output: one line per run and the ratios (read in bench/results/fp8_gather_2026-11-29.md).
case "${1:-}" in
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${1:-build}
sw=$(cd "$build/tools" && pwd)/shardwise
steps=${STEPS:-20} rate=${RATE:-100mbit}
source bench/link_common.sh
link_init fp8_gather_link swfg /tmp/sw_fp8_gather_link.XXXXXX
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
source scripts/fortunes.sh
prepare_fortunes "$sw"
cat >"$work/cfg.json" <<JSON
{
  "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 8, "n_head": 4, "d_model": 256,
            "seq_len": 128},
  "data": {"train": "$root/data/fortunes_train.bin"},
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "train_steps": $steps,
  "eval_every_steps": 0, "log_every_steps": 1, "threads": 1, "seed": 1,
  "optimizer": {"params": {"lr": 0.001}}, "gradient_clipping": 1.0, "comm_timeout_s": 600,
  "bf16": {"enabled": true},
  "fp8": {"enabled": true, "round_scales_to_power_of_2": true},
  "sharding_strategy": "FULL_SHARD"
}
JSON
link_across "$A" tcp,self 1 OMP_NUM_THREADS OMP_WAIT_POLICY
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
netns_down "$prefix" >/dev/null 2>&1 || true
link_up fp8_gather_link "$prefix" "$rate" 256kb delay 10ms limit 10000
echo "## link: $qdisc on both ends of $V; 1 rank per host, $steps steps"
: >"$work/rows"
for m in bf16_gather fp8_gather; do
  extra=""
  [ "$m" = fp8_gather ] && extra="--set fp8.all_gather=true"
  b0=$(link_bytes "$B" "$V")
  # shellcheck disable=SC2086
  timeout 3600 bench/quiet.sh "${across[@]}" "$sw" train "$work/cfg.json" --quiet --no-export \
    --set run_dir="$work/$m" $extra >"$work/$m.log" 2>&1 ||
    { cat "$work/$m.log" >&2; echo "fp8_gather_link: $m failed" >&2; exit 1; }
  b1=$(link_bytes "$B" "$V")
  python3 - "$work/$m/metrics.jsonl" "$m" "$((b1 - b0))" "$steps" "$work/rows" <<'PY'
import json, sys
path, m, b, steps, rows = sys.argv[1:6]
lines = [json.loads(l) for l in open(path)]
st = [l["step_time_s"] for l in lines[1:]]
tps = sum(l["tokens_per_s"] * l["step_time_s"] for l in lines[1:]) / sum(st)
per = int(b) / int(steps)
print(f"{m}: link bytes per step {per / 1e6:.3f} MB, tokens/s {tps:.0f}, comm_s/step "
      f"{sum(l['comm_s'] for l in lines[1:]) / len(st):.3f}, loss {lines[-1]['loss']:.6f}")
open(rows, "a").write(f"{m} {per} {tps} {' '.join(repr(l['loss']) for l in lines)}\n")
PY
done
python3 - "$work/rows" <<'PY'
import sys
r = {l.split()[0]: l.split()[1:] for l in open(sys.argv[1])}
a, b = r["bf16_gather"], r["fp8_gather"]
same = a[2:] == b[2:]
print(f"bytes per step fp8 / bf16 gather: {float(b[0]) / float(a[0]):.3f}; tokens/s fp8 / bf16: "
      f"{float(b[1]) / float(a[1]):.2f}x; losses bit-identical over {len(a) - 2} steps: {same}")
sys.exit(0 if same else 1)
PY
netns_down "$prefix" >/dev/null 2>&1 || true
