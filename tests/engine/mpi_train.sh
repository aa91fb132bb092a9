#!/bin/bash
# End-to-end `mpirun -np 2 shardwise train` against the one-rank run with the same global
# batch (label mpi). Usage: mpi_train.sh SHARDWISE MPIEXEC [mpirun flags...]
#   1. one rank, micro-batch 4                         -> reference
#   2. 2 ranks FULL_SHARD, micro-batch 2               -> same losses, grad norms, val losses,
#                                                         exported weights
#   3. 2 ranks NO_SHARD, micro-batch 1 x 2 accumulation (reduce_each_micro_step)
#   4. 2 ranks HYBRID_SHARD (groups of 1, blocks_per_unit 2, comm_debug on), SHARD_OPTIMIZER
#   5. error paths: a data file no rank can open (non-zero exit, message naming it); a run
#      that diverges on every rank (the non-finite error printed once, by rank 0)
# Only rank 0 writes run_dir: metrics.jsonl has one line per step, with comm_s.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/mpi_common.sh" mpi_train "$@"
py=/usr/bin/python3

prepare_text 4000
tiny_gpt_config "$work/cfg.json"

export OMP_NUM_THREADS=1
"$sw" train "$work/cfg.json" --quiet >"$work/r1.log" 2>&1 || { cat "$work/r1.log"; fail "one-rank run"; }

run2() {  # name, --set overrides...
  local name=$1
  shift
  timeout 120 "${mpirun[@]}" -np 2 "$sw" train "$work/cfg.json" --quiet --set run_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name: exit status $?"; }
}
run2 full --set train_micro_batch_size_per_gpu=2 --set sharding_strategy=FULL_SHARD
run2 noshard --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=2 \
  --set zero_optimization.stage=0 --set gradient_accumulation_mode=reduce_each_micro_step
run2 hybrid --set train_micro_batch_size_per_gpu=2 --set sharding_strategy=HYBRID_SHARD \
  --set shard_group_size=1 --set blocks_per_unit=2 --set comm_debug=true --set comm_timeout_s=60
run2 stage1 --set train_micro_batch_size_per_gpu=2 --set zero_optimization.stage=1

# noshard's validation uses micro-batch 1 (2 ranks x 1 row = other windows than one rank x 4):
# its val_loss is not compared.
"$py" - "$work" full noshard:noval hybrid stage1 <<'PY' || exit 1
import json, struct, sys
import numpy as np
work, names = sys.argv[1], sys.argv[2:]

def metrics(run):
    return [json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl")]

def weights(run):
    b = open(f"{work}/{run}/hf/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + lo:8 + n + hi], dtype=np.float32)
    return out

ref, wref = metrics("r1"), weights("r1")
bad = []
for spec in names:
    run, _, flag = spec.partition(":")
    m, w = metrics(run), weights(run)
    if len(m) != len(ref):
        bad.append(f"{run}: {len(m)} metrics lines, expected {len(ref)} (rank 0 alone writes)")
        continue
    for a, b in zip(m, ref):
        for key, tol in (("loss", 1e-5), ("grad_norm", 1e-4), ("val_loss", 1e-5)):
            if key == "val_loss" and flag == "noval":
                continue
            if key in b and abs(a[key] - b[key]) > tol * abs(b[key]):
                bad.append(f"{run} step {b['step']}: {key} {a[key]} vs one rank {b[key]}")
        for key in ("comm_s", "exposed_comm_s"):
            if key not in a:
                bad.append(f"{run}: metrics lack {key}")
    if not m[-1].get("comm_s", 0) > 0:
        bad.append(f"{run}: comm_s is {m[-1].get('comm_s')} with 2 ranks")
    if sorted(w) != sorted(wref):
        bad.append(f"{run}: exported tensors differ in names")
        continue
    worst = max(float(np.max(np.abs(w[k] - wref[k]))) for k in w)
    if worst > 1e-4:
        bad.append(f"{run}: exported weights differ by up to {worst}")
    print(f"mpi_train: {run}: final loss {m[-1]['loss']:.6f} (one rank {ref[-1]['loss']:.6f}), "
          f"weights within {worst:.2e}")
if bad:
    print("mpi_train: FAIL:\n  " + "\n  ".join(bad))
    sys.exit(1)
PY

# Errors end every rank with a non-zero status and a message naming the problem.
start=$(date +%s)
timeout 60 "${mpirun[@]}" -np 2 "$sw" train "$work/cfg.json" --quiet --set run_dir="$work/bad" \
  --set data.train="$work/missing.bin" >"$work/bad.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] || fail "a missing data file exited 0"
[ "$rc" -ne 124 ] || fail "a missing data file hung"
grep -q "missing.bin" "$work/bad.log" || { cat "$work/bad.log"; fail "no message naming the file"; }
# A collective error (non-finite loss on every rank) is printed once, by rank 0.
timeout 60 "${mpirun[@]}" -np 2 "$sw" train "$work/cfg.json" --quiet --set run_dir="$work/nan" \
  --set optimizer.params.lr=1e30 --set gradient_clipping=0 >"$work/nan.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat "$work/nan.log"; fail "a diverging run: status $rc"; }
n=$(grep -c "train: non-finite" "$work/nan.log")
[ "$n" -eq 1 ] || { cat "$work/nan.log"; fail "non-finite error printed $n times (want 1)"; }
# A usage mistake: every rank parses the same line and exits 2; rank 0 alone prints it.
timeout 60 "${mpirun[@]}" -np 2 "$sw" train "$work/cfg.json" --quiet --bogus >"$work/usage.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] || { cat "$work/usage.log"; fail "a usage mistake under mpirun: status $rc (want 2)"; }
n=$(grep -c "^shardwise train: unknown option '--bogus'" "$work/usage.log")
[ "$n" -eq 1 ] || { cat "$work/usage.log"; fail "usage mistake printed $n times (want 1)"; }
echo "mpi_train: ok ($(($(date +%s) - start)) s for the error runs)"
