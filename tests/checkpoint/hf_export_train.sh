#!/bin/bash
# The end-of-run export from a real run (labels mpi, reference): a byte-level BPE
# tokenizer.json trained here with PyPI's `tokenizers`, `shardwise data prepare --tokenizer`,
# then `mpirun -np 2 shardwise train` of a Llama with GQA (FULL_SHARD, exported in several
# files, so both ranks write some) and a final checkpoint. Checks:
#   - <run_dir>/hf loads with transformers' AutoModelForCausalLM and AutoTokenizer, whose mean
#     loss over the validation file's seq_len windows equals `shardwise eval --weights run/hf`
#     within 1e-4 relative, and whose encoding equals `tokenizers` (hf_export_check.py evalloss)
#   - `shardwise ckpt export CKPT --out DIR` writes the same files (tokenizer from the run's
#     config), and --out F.safetensors the single file with the same tensors
# Usage: hf_export_train.sh SHARDWISE REF_PYTHON WORK MPIEXEC [mpirun flags...]
set -u
sw=$1 py=$2 work=$3
shift 3
mpirun=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fail() {
  echo "hf_export_train: FAIL: $*"
  exit 1
}
rm -rf "$work" && mkdir -p "$work" || fail "cannot make $work"
"$py" - "$work/corpus.txt" "$work/val.txt" <<'PY' || fail "corpus"
import random, sys
w = "the quick brown fox jumps over lazy dog pack my box with five dozen liquor jugs".split()
for seed, path, n in ((3, sys.argv[1], 400), (4, sys.argv[2], 40)):
    random.seed(seed)
    with open(path, "w") as f:
        for i in range(n):
            f.write(" ".join(random.choice(w) for _ in range(random.randint(3, 12))) + ".\n")
PY
"$py" "$here/hf_export_check.py" tokenizer "$work/tokenizer.json" "$work/corpus.txt" bytelevel ||
  fail "tokenizer"
for f in corpus:train val:val; do
  "$sw" data prepare "$work/${f%%:*}.txt" --tokenizer "$work/tokenizer.json" --quiet \
    --out "$work/${f##*:}.bin" >"$work/prepare.log" 2>&1 ||
    { cat "$work/prepare.log"; fail "data prepare"; }
done
cat >"$work/cfg.json" <<EOF
{
  "model": {"type": "llama", "vocab_size": 320, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
            "d_model": 64, "seq_len": 32, "rope_theta": 500000.0},
  "data": {"train": "$work/train.bin", "tokenizer": "$work/tokenizer.json"},
  "train_micro_batch_size_per_gpu": 2,
  "train_steps": 6,
  "scheduler": {"type": "Constant", "params": {}},
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
  "sharding_strategy": "FULL_SHARD",
  "checkpoint": {"every_steps": 6, "export_shard_bytes": 60000},
  "run_dir": "$work/run"
}
EOF
export OMP_NUM_THREADS=1
timeout 200 "${mpirun[@]}" -np 2 "$sw" train "$work/cfg.json" --quiet >"$work/train.log" 2>&1 ||
  { cat "$work/train.log"; fail "train on 2 ranks"; }
hf=$work/run/hf
ls "$hf"/model-0000*-of-*.safetensors >/dev/null 2>&1 || fail "no sharded files in $hf: $(ls "$hf")"
[ -f "$hf/tokenizer.json" ] && [ -f "$hf/tokenizer_config.json" ] || fail "no tokenizer in $hf"
[ ! -e "$work/run/model.safetensors" ] || fail "the old single file is still written"
"$sw" eval "$work/cfg.json" --weights "$hf" --data "$work/val.bin" >"$work/eval.log" 2>&1 ||
  { cat "$work/eval.log"; fail "eval"; }
loss=$(awk '/^loss/ {print $2}' "$work/eval.log")
[ -n "$loss" ] || fail "no loss in $(cat "$work/eval.log")"
"$py" "$here/hf_export_check.py" evalloss "$hf" "$work/val.bin" 32 "$loss" "$work/tokenizer.json" \
  "$work/corpus.txt" || fail "transformers disagrees"

"$sw" ckpt export "$work/run/checkpoints" --out "$work/ck" --max-shard-bytes 60000 \
  >"$work/export.log" 2>&1 || { cat "$work/export.log"; fail "ckpt export --out DIR"; }
for f in "$hf"/*; do
  cmp "$f" "$work/ck/$(basename "$f")" ||
    fail "ckpt export: $(basename "$f") differs from the run's"
done
[ "$(ls "$hf" | wc -l)" = "$(ls "$work/ck" | wc -l)" ] || fail "ckpt export: other files"
"$sw" ckpt export "$work/run/checkpoints" --out "$work/one.safetensors" >"$work/export1.log" 2>&1 ||
  { cat "$work/export1.log"; fail "ckpt export --out FILE"; }
"$py" - "$hf" "$work/one.safetensors" <<'PY' || fail "the single file's tensors differ"
import json, sys
import numpy as np
from safetensors.numpy import load_file
d, one = sys.argv[1], load_file(sys.argv[2])
index = json.load(open(d + "/model.safetensors.index.json"))
many = {}
for f in set(index["weight_map"].values()):
    many.update(load_file(d + "/" + f))
assert set(many) == set(one) and all(np.array_equal(many[k], one[k]) for k in one)
PY
echo "hf_export_train: ok (eval loss $loss)"
