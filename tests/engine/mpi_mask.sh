#!/bin/bash
# Loss masks at 2 ranks (label mpi): a corpus directory of two masked token files (windows of
# very different counted targets), trained by one rank with micro-batch 4 and by 2 ranks with
# micro-batch 2, and 1 x 2 accumulation: the step losses, gradient norms and validation losses
# agree within 1e-5 relative (the global batch's counted-target mean does not depend on the
# split; a per-rank mean would), and metrics.jsonl carries the epoch. Then the 2-rank run
# stopped at step 6 and resumed (steps 7..12 cross a file and an epoch boundary) must equal the
# uninterrupted one exactly: losses, norms and the exported weights.
# Usage: mpi_mask.sh SHARDWISE MPIEXEC [mpirun flags...]
set -u
source "$(dirname "${BASH_SOURCE[0]}")/mpi_common.sh" mpi_mask "$@"
py=/usr/bin/python3
mkdir -p "$work/corpus"
"$py" - "$work" <<'PY' || fail "writing the corpus"
import random, struct, sys
work = sys.argv[1]
rng = random.Random(4)
def write(path, magic, version, body, fmt):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", magic, version, len(body), *([0] * 253)))
        f.write(struct.pack(f"<{len(body)}{fmt}", *body))
for name, n in (("corpus/a", 300), ("corpus/b", 400), ("val", 600)):
    toks = [rng.randrange(64) for _ in range(n)]
    # runs of 30 tokens alternately mostly counted and mostly not
    mask = [int((i // 30) % 2 == 0) if rng.random() < 0.9 else 1 - int((i // 30) % 2 == 0)
            for i in range(n)]
    write(f"{work}/{name}.bin", 20240520, 1, toks, "H")
    write(f"{work}/{name}.mask", 20261129, 1, mask, "B")
PY
cat >"$work/cfg.json" <<JSON
{
  "model": {"type": "gpt2", "vocab_size": 64, "n_layer": 2, "n_head": 2, "d_model": 32,
            "seq_len": 16},
  "data": {"train": "$work/corpus", "val": "$work/val.bin"},
  "train_micro_batch_size_per_gpu": 4, "train_steps": 12, "eval_every_steps": 6,
  "eval_batches": 2, "threads": 1, "seed": 8,
  "optimizer": {"params": {"lr": 0.003}},
  "scheduler": {"params": {"warmup_num_steps": 2, "total_num_steps": 12}}
}
JSON
export OMP_NUM_THREADS=1
"$sw" train "$work/cfg.json" --quiet --set run_dir="$work/r1" >"$work/r1.log" 2>&1 ||
  { cat "$work/r1.log"; fail "one-rank run"; }
run2() {  # name, --set overrides...
  local name=$1
  shift
  timeout 120 "${mpirun[@]}" -np 2 "$sw" train "$work/cfg.json" --quiet --set run_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name: exit status $?"; }
}
run2 r2 --set train_micro_batch_size_per_gpu=2
run2 r2acc --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=2
run2 half --set train_micro_batch_size_per_gpu=2 --set train_steps=6 --set checkpoint.every_steps=2
run2 half --set train_micro_batch_size_per_gpu=2 --set checkpoint.every_steps=2 --resume auto
grep -q "resumed from $work/half/checkpoints/step_6 at step 6" "$work/half.log" ||
  { cat "$work/half.log"; fail "half: no 'resumed from' line"; }
cmp "$work/r2/hf/model.safetensors" "$work/half/hf/model.safetensors" ||
  fail "the resumed run's weights differ from the uninterrupted run's"
"$py" - "$work" <<'PY' || fail "masked losses differ between splits"
import json, sys
work = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
ref = rows("r1")
assert len(ref) == 12, len(ref)
# windows: a 299 // 16 = 18, b 399 // 16 = 24 -> 42; 4 rows a step: epoch 1 from row 42
assert [r["epoch"] for r in ref] == [s * 4 // 42 for s in range(12)], [r["epoch"] for r in ref]
half, full = rows("half"), rows("r2")
assert len(half) == 12, len(half)
for a, b in zip(full, half):
    for k in ("loss", "grad_norm", "epoch"):
        assert a[k] == b[k], ("resume", a["step"], k, a[k], b[k])
for name in ("r2", "r2acc"):
    got = rows(name)
    assert len(got) == 12, (name, len(got))
    for a, b in zip(ref, got):
        for k in ("loss", "grad_norm", "val_loss"):
            if k not in a:
                continue
            if name == "r2acc" and k == "val_loss":
                continue  # its validation batch is 2 ranks x 1 row: other windows
            rel = abs(a[k] - b[k]) / abs(a[k])
            assert rel < 1e-5, (name, a["step"], k, a[k], b[k], rel)
print("mpi_mask: 1 rank vs 2 ranks and 2 ranks x 2 micro-steps agree")
PY
echo "mpi_mask: PASS"
