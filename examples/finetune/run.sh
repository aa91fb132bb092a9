#!/bin/bash
# Fine-tunes an imported Hugging Face model on prompt / completion pairs (see README.md):
#   1. make_model.py: a random-weight Llama and its BPE tokenizer, saved by transformers, and
#      a JSONL of prompt / completion pairs;
#   2. shardwise data prepare --jsonl --tokenizer: train.bin / val.bin with loss masks
#      (train.mask / val.mask: prompt tokens 0, so only completions count);
#   3. shardwise eval before, shardwise train --init-from the model directory, eval after.
# Exits 1 unless the training loss and the validation loss fell.
# usage: run.sh [OUT_DIR]   (env: SHARDWISE = the binary, PYTHON = a Python with transformers)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
sw=${SHARDWISE:-$root/build/tools/shardwise}
py=${PYTHON:-$root/.venv/bin/python}
if [ $# -ge 1 ]; then
  out=$1
  mkdir -p "$out"
else  # a temporary directory, removed at the end
  out=$(mktemp -d /tmp/sw_finetune.XXXXXX)
  trap 'rm -rf "$out"' EXIT
fi
steps=${STEPS:-150}

"$py" "$here/make_model.py" "$out"
"$sw" data prepare "$out/pairs.jsonl" --jsonl --tokenizer "$out/model" --out "$out/train.bin" \
  --val "$out/val.bin" --val-fraction 0.1 --quiet
cat >"$out/finetune.json" <<JSON
{
  "checkpoint": {"init_from": "$out/model"},
  "model": {"seq_len": 64},
  "data": {"train": "$out/train.bin", "val": "$out/val.bin", "tokenizer": "$out/model"},
  "run_dir": "$out/run",
  "train_micro_batch_size_per_gpu": 8, "train_steps": $steps, "seed": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.0}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10}},
  "eval_every_steps": 50, "eval_batches": 4, "threads": ${THREADS:-2}
}
JSON
before=$("$sw" eval "$out/finetune.json" --weights "$out/model" --data "$out/val.bin")
echo "before: $before"
"$sw" train "$out/finetune.json" --quiet
after=$("$sw" eval "$out/finetune.json" --weights "$out/run/hf" --data "$out/val.bin")
echo "after:  $after"
"$py" - "$out/run/metrics.jsonl" "$before" "$after" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
first, last = m[0]["loss"], m[-1]["loss"]
b, a = float(sys.argv[2].split()[1]), float(sys.argv[3].split()[1])
print(f"train loss (completion tokens): step 1 {first:.4f} -> step {m[-1]['step']} {last:.4f}; "
      f"eval on val.bin: {b:.4f} -> {a:.4f}")
ok = last < 0.5 * first and a < 0.5 * b
sys.exit(0 if ok else 1)
PY
