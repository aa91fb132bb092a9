#!/usr/bin/env bash
# gpu_fp8_step.sh BUILD LOGDIR: the FP8 linears' throughput on a GPU (issue 39, point 3): the
# 1.3B Llama of bench/gpu_vs_torch.sh (its shape from bench/torch_gpu_step.py --shape-only,
# batch 4, T 2048, uniform token ids) trained a few steps in bf16 and with "fp8" (current
# scaling), one after the other; prints each run's median tokens/s after the warm-up steps and
# the ratio fp8 / bf16 (the issue's goal: >= 1.3). Run by scripts/gpu_lease.sh; needs the
# CUDA build in BUILD (the shardwise target is built if absent). Logs and metrics in LOGDIR.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${1:-build-gpu} logs=${2:-$build/logs}
steps=${FP8_STEPS:-6} warm=${FP8_WARMUP:-2}
mkdir -p "$logs"
work=$(mktemp -d /tmp/gpu_fp8.XXXXXX)
trap 'rm -rf "$work"' EXIT
sw=$build/tools/shardwise
if [ ! -x "$sw" ]; then
  cmake --build "$build" --target shardwise >"$logs/fp8_build_shardwise.log" 2>&1 ||
    { echo "gpu_fp8_step: building shardwise failed ($logs/fp8_build_shardwise.log)"; exit 1; }
fi
shape=$(python3 bench/torch_gpu_step.py --model llama --shape-only --batch 0) ||
  { echo "gpu_fp8_step: bench/torch_gpu_step.py --shape-only failed"; exit 1; }
for mode in bf16 fp8; do
  python3 - "$shape" "$work" "$mode" "$((steps + warm))" >"$work/$mode.json" <<'PY'
import array, json, os, struct, sys
s, work, mode, steps = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
tok = os.path.join(work, "tokens.bin")
if not os.path.exists(tok):
    n = max(1 << 20, 64 * (s["T"] + 1))
    raw = array.array("H", os.urandom(2 * n))
    with open(tok, "wb") as f:  # llm.c's header, then uint16 ids below the vocabulary
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(array.array("H", (t % s["vocab"] for t in raw)).tobytes())
cfg = {"model": {"type": "llama", "vocab_size": s["vocab"], "n_layer": s["layers"],
                 "n_head": s["heads"], "n_kv_head": s["kv_heads"], "d_model": s["d"],
                 "d_ff": s["d_ff"], "seq_len": s["T"]},
       "data": {"train": tok}, "run_dir": os.path.join(work, "run_" + mode), "device": "cuda",
       "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": s["batch"],
       "gradient_accumulation_steps": 1, "train_steps": steps, "seed": 1337,
       "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
       "scheduler": {"type": "Constant"}, "gradient_clipping": 1.0,
       "zero_optimization": {"stage": 3}, "eval_every_steps": 0, "log_every_steps": 1}
if mode == "fp8":
    cfg["fp8"] = {"enabled": True, "recipe": "current"}
print(json.dumps(cfg, indent=1))
PY
  timeout -k 10 120 "$sw" train "$work/$mode.json" --quiet --no-export >"$logs/fp8_run_$mode.log" 2>&1
  echo "gpu_fp8_step: $mode exit $?"
  cp "$work/run_$mode/metrics.jsonl" "$logs/fp8_metrics_$mode.jsonl" 2>/dev/null
done
python3 - "$logs" "$warm" <<'PY'
import json, statistics, sys
logs, warm = sys.argv[1], int(sys.argv[2])
tps = {}
for mode in ("bf16", "fp8"):
    try:
        rows = [json.loads(l) for l in open(f"{logs}/fp8_metrics_{mode}.jsonl") if l.strip()]
        tps[mode] = statistics.median(r["tokens_per_s"] for r in rows[warm:])
        print(f"{mode}: median tokens/s {tps[mode]:.0f} over steps {warm + 1}-{len(rows)}, "
              f"losses {[round(r['loss'], 4) for r in rows]}, peak {rows[-1]['peak_mem_bytes'] / 2**30:.2f} GiB")
    except (OSError, KeyError, ValueError, statistics.StatisticsError) as e:
        print(f"{mode}: no metrics ({e})")
if len(tps) == 2:
    print(f"fp8 / bf16 tokens/s: {tps['fp8']:.0f} / {tps['bf16']:.0f} = {tps['fp8'] / tps['bf16']:.3f}")
PY
