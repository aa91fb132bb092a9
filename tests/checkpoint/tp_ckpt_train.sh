#!/bin/bash
# `shardwise train` saves and resumes across mesh shapes (issue 36; label mpi): a tiny GPT-2
# trained 6 steps at tensor 2 x FULL_SHARD 2 (4 ranks), saving at steps 3 and 6 (async: the
# snapshot path); then resumed from step 3 at one rank, at tensor 1 x FULL_SHARD 4 and at
# tensor 4 (the same global batch of 4 rows: train_micro_batch_size_per_gpu is per
# data-parallel rank). Steps 4-6 must give the
# first run's losses within 1e-5 relative (fp32 summation order differs between meshes), and
# gradient norms within 1e-4. `shardwise ckpt verify`, `inspect` and `export` read the step-6 (v2)
# checkpoint; the export has every logical tensor.
# Usage: tp_ckpt_train.sh SHARDWISE WORK MPIEXEC [mpirun flags...]
set -u
sw=$1 work=$2
shift 2
mpirun=("$@")
fail() {
  echo "tp_ckpt_train: FAIL: $*"
  exit 1
}
rm -rf "$work" && mkdir -p "$work" || fail "cannot make $work"
python3 - "$work/corpus.txt" <<'PY' || fail "corpus"
import random, sys
random.seed(5)
w = "the quick brown fox jumps over lazy dog pack my box with five dozen liquor jugs".split()
with open(sys.argv[1], "w") as f:
    for i in range(300):
        f.write(" ".join(random.choice(w) for _ in range(random.randint(3, 12))) + ".\n")
PY
"$sw" data prepare "$work/corpus.txt" --quiet --out "$work/train.bin" >"$work/prepare.log" 2>&1 ||
  { cat "$work/prepare.log"; fail "data prepare"; }
# config NAME TENSOR MICRO_BATCH RESUME ASYNC
config() {
  cat >"$work/$1.json" <<EOF
{
  "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 2, "n_head": 4, "d_model": 32,
            "seq_len": 16},
  "data": {"train": "$work/train.bin"},
  "parallelism": {"tensor_parallel_degree": $2},
  "train_micro_batch_size_per_gpu": $3,
  "train_steps": 6,
  "scheduler": {"type": "Constant", "params": {}},
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
  "sharding_strategy": "FULL_SHARD",
  "checkpoint": {"every_steps": 3, "resume": "$4", "async": $5},
  "run_dir": "$work/$1"
}
EOF
}
export OMP_NUM_THREADS=1
run() {  # NAME RANKS
  timeout 200 "${mpirun[@]}" -np "$2" "$sw" train "$work/$1.json" --quiet --no-export \
    >"$work/$1.log" 2>&1 || { cat "$work/$1.log"; fail "train $1 on $2 ranks"; }
}
config a 2 2 "" true
run a 4
step3=$work/a/checkpoints/step_3
[ -f "$step3/metadata.json" ] || fail "no $step3: $(ls "$work/a/checkpoints")"
grep -q '"format_version": 2' "$step3/metadata.json" || fail "step 3 is not a v2 checkpoint"
config one 1 4 "$step3" false
run one 1
config t1x4 1 1 "$step3" false
run t1x4 4
config t4 4 4 "$step3" false
run t4 4
python3 - "$work" <<'PY' || fail "resumed losses differ"
import json, sys
def steps(run):
    out = {}
    for line in open(f"{sys.argv[1]}/{run}/metrics.jsonl"):
        j = json.loads(line)
        if "loss" in j and "step" in j:
            out[j["step"]] = j
    return out
a = steps("a")
bad = 0
for run in ("one", "t1x4", "t4"):
    b = steps(run)
    later = sorted(s for s in b if s in a)
    assert later == [4, 5, 6] and min(b) == 4, (run, sorted(b))
    for s in later:
        dl = abs(b[s]["loss"] - a[s]["loss"]) / abs(a[s]["loss"])
        dn = abs(b[s]["grad_norm"] - a[s]["grad_norm"]) / abs(a[s]["grad_norm"])
        print(f"{run} step {s}: loss {b[s]['loss']:.8f} vs {a[s]['loss']:.8f} ({dl:.1e}), "
              f"grad_norm rel {dn:.1e}")
        bad += dl > 1e-5 or dn > 1e-4
sys.exit(1 if bad else 0)
PY
step6=$work/a/checkpoints/step_6
"$sw" ckpt verify "$step6" >"$work/verify.log" 2>&1 || { cat "$work/verify.log"; fail "verify"; }
"$sw" ckpt inspect "$step6" >"$work/inspect.log" 2>&1 || { cat "$work/inspect.log"; fail "inspect"; }
grep -q "tensor parallel 2" "$work/inspect.log" || fail "inspect does not say the tensor degree"
"$sw" ckpt export "$step6" --out "$work/a6.safetensors" >"$work/export.log" 2>&1 ||
  { cat "$work/export.log"; fail "export"; }
"$sw" ckpt export "$work/one/checkpoints/step_6" --out "$work/one6.safetensors" \
  >"$work/export1.log" 2>&1 || { cat "$work/export1.log"; fail "export of the one-rank run"; }
python3 - "$work/a6.safetensors" "$work/one6.safetensors" <<'PY' || fail "exports differ"
import json, struct, sys
def read(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["shape"], struct.unpack(f"<{(v['data_offsets'][1] - v['data_offsets'][0]) // 4}f",
                b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])) for k, v in h.items()}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
worst = 0
for k in a:
    assert a[k][0] == b[k][0], k
    worst = max(worst, max(abs(x - y) / (1 + abs(y)) for x, y in zip(a[k][1], b[k][1])))
print(f"exports: {len(a)} tensors, worst relative difference {worst:.1e}")
sys.exit(0 if worst < 1e-4 else 1)
PY
echo "tp_ckpt_train: ok"
