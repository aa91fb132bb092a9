#!/bin/bash
# Local SGD / DiLoCo end to end (issue 38, label mpi): `mpirun -np 2|4 shardwise train` with
# local_sgd.sync_every. Usage: mpi_local_sgd.sh SHARDWISE MPIEXEC [mpirun flags...]
#
# A 2-layer GPT-2 on byte text, 8 steps, validation at the end:
#   FedAvg with one inner step per round (sync_every 1, outer SGD lr 1, no momentum) and an
#   inner SGD equals plain data parallelism with that SGD (each rank's step is linear in its
#   gradient: the mean of the replicas' steps is the step of the mean gradient): loss and
#   validation loss within 1e-5 relative and the exported weights within 1e-5, NO_SHARD at 2
#   ranks and HYBRID_SHARD 2 x 2 at 4 (grad_norm is each replica's own gradient's there).
#   DiLoCo (sync_every 4, outer Nesterov 0.7 / 0.9) and streaming (2 fragments), fp32 and bf16
#   pseudo-gradients: the run ends a round, every replica exports the same weights (replica 0
#   writes them), the validation loss is finite and below the first step's loss.
#   Resume mid-round, bitwise: streaming DiLoCo (2 fragments, sync_every 4, the reduce landing
#   one step late, alpha 0.5, int8 pseudo-gradients with error feedback) on HYBRID 2 x 2 with
#   int8 gradient reduction inside each replica, saved every 3 steps; a second run resumed from
#   step 3 (mid-round) and from step 6 (fragment 0's reduce in flight at the save) equals the
#   uninterrupted run's every later loss and exported weight exactly. A checkpoint of 2 replica
#   groups of 2 refuses a resume on 2 of 1 (one line naming the mesh).
# Errors, one line each: a strategy without replicas, fragments not dividing sync_every,
# a sync delay not below sync_every / fragments.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/mpi_common.sh" mpi_local_sgd "$@"
py=/usr/bin/python3

prepare_text 2000
export OMP_NUM_THREADS=1
cat >"$work/g.json" <<JSON
{
  "model": {"type": "gpt2", "vocab_size": 128, "n_layer": 2, "n_head": 4, "d_model": 64,
            "seq_len": 32},
  "data": {"train": "$work/train.bin", "val": "$work/val.bin"},
  "train_micro_batch_size_per_gpu": 2, "train_steps": 8, "eval_batches": 2,
  "log_every_steps": 8, "threads": 1, "comm_timeout_s": 60,
  "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0, "weight_decay": 0}},
  "gradient_clipping": 0
}
JSON
sed -e 's/"type": "SGD", "params": {"lr": 0.05, "momentum": 0, "weight_decay": 0}/"type": "AdamW", "params": {"lr": 0.003}/' \
  "$work/g.json" >"$work/adam.json"
failed=()
run() {  # name, ranks, config, --set overrides...
  local name=$1 np=$2 cfg=$3
  shift 3
  local rc=0
  timeout 120 "${mpirun[@]}" -np "$np" "$sw" train "$work/$cfg.json" --quiet \
    --set run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || failed+=("$name: exit status $rc: $(grep -m1 'error' "$work/$name.log")")
}
ns=(--set zero_optimization.stage=0)
hy=(--set sharding_strategy=HYBRID_SHARD --set shard_group_size=2 --set train_micro_batch_size_per_gpu=1)
fedavg=(--set local_sgd.sync_every=1 --set local_sgd.outer_optimizer.params.lr=1
        --set local_sgd.outer_optimizer.params.momentum=0)
run ddp 2 g "${ns[@]}"
run fedavg 2 g "${ns[@]}" "${fedavg[@]}"
run hybrid 4 g "${hy[@]}"
run hybrid_fedavg 4 g "${hy[@]}" "${fedavg[@]}"
run diloco 2 adam "${ns[@]}" --set local_sgd.sync_every=4
run diloco_bf16 2 adam "${ns[@]}" --set local_sgd.sync_every=4 --set local_sgd.outer_dtype=bf16
run streaming 4 adam "${hy[@]}" --set local_sgd.sync_every=4 --set local_sgd.fragments=2
# Resume mid-round (bitwise): the full run saves at 3 and 6 (step 6: fragment 0's reduce in
# flight), the resumed runs restart from those.
st=("${hy[@]}" --set local_sgd.sync_every=4 --set local_sgd.fragments=2
    --set local_sgd.fragment_sync_delay=1 --set local_sgd.fragment_update_alpha=0.5
    --set local_sgd.outer_dtype=int8 --set zero_optimization.zero_quantized_gradients=true
    --set checkpoint.every_steps=3 --set checkpoint.keep_last=0)
run st_full 4 adam "${st[@]}" --set checkpoint.dir="$work/ck_full"
for at in 3 6; do
  mkdir -p "$work/ck_$at"
  cp -r "$work/ck_full/step_$at" "$work/ck_$at/"
  run st_from$at 4 adam "${st[@]}" --set checkpoint.dir="$work/ck_$at" --set checkpoint.resume=auto
done

PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")/../common" "$py" - "$work" <<'PY' || failed+=("parity")
import sys
import numpy as np
import run_files
work = sys.argv[1]
def metrics(run): return run_files.metrics(work, run, missing_ok=True)
def weights(run): return run_files.weights(work, run)
bad = []
for run, ref in (("fedavg", "ddp"), ("hybrid_fedavg", "hybrid")):
    m, r = metrics(run), metrics(ref)
    if m is None or r is None:
        bad.append(f"{run} or {ref}: no metrics"); continue
    worst = 0.0
    for a, b in zip(m, r):
        for k in ("loss", "val_loss"):
            if k in b and b[k]:
                rel = abs(a[k] - b[k]) / abs(b[k])
                worst = max(worst, rel)
                if rel > 1e-5:
                    bad.append(f"{run} step {b['step']}: {k} {a[k]} vs {ref} {b[k]} ({rel:.1e})")
    wa, wb = weights(run), weights(ref)
    dw = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wb)
    print(f"mpi_local_sgd: {run} vs {ref}: worst relative {worst:.1e}, weights up to {dw:.1e}")
    if dw > 1e-5:
        bad.append(f"{run}: exported weights differ from {ref}'s by {dw:.1e}")
def same(a, b):
    return all(x == y for x, y in zip(a, b))
full = metrics("st_full")
for at in (3, 6):
    m = metrics(f"st_from{at}")
    if full is None or m is None:
        bad.append(f"st_from{at}: no metrics"); continue
    tail = [r for r in full if r["step"] > at]
    got = [(r["step"], r["loss"]) for r in m]
    want = [(r["step"], r["loss"]) for r in tail]
    if got != want:
        bad.append(f"st_from{at}: losses {got} differ from the uninterrupted run's {want}")
    wa, wb = weights(f"st_from{at}"), weights("st_full")
    diff = [k for k in wb if not np.array_equal(wa[k], wb[k])]
    print(f"mpi_local_sgd: resumed at {at}: {len(got)} losses, {len(wb) - len(diff)}/{len(wb)} weights equal bitwise")
    if diff:
        bad.append(f"st_from{at}: exported weights differ from the uninterrupted run's: {diff[:3]}")
for run in ("diloco", "diloco_bf16", "streaming", "st_full"):
    m = metrics(run)
    if m is None:
        bad.append(f"{run}: no metrics"); continue
    v = m[-1].get("val_loss")
    print(f"mpi_local_sgd: {run}: first loss {m[0]['loss']:.4f}, last {m[-1]['loss']:.4f}, val {v}")
    if v is None or not np.isfinite(v) or v >= m[0]["loss"]:
        bad.append(f"{run}: validation loss {v} not below the first step's {m[0]['loss']}")
if bad:
    print("\n".join(bad)); sys.exit(1)
PY

expect_error() {  # name, expected text, command...
  local name=$1 text=$2
  shift 2
  if timeout 60 "$@" >"$work/$name.log" 2>&1; then cat "$work/$name.log"; fail "$name: exit 0"; fi
  grep -qF -- "$text" "$work/$name.log" || { cat "$work/$name.log"; fail "$name: no '$text'"; }
}
tr=("$sw" train "$work/g.json" --quiet --no-export)
expect_error fsdp "local_sgd.sync_every: replica groups train apart: needs sharding_strategy HYBRID_SHARD" \
  "${tr[@]}" --set local_sgd.sync_every=4 --set run_dir="$work/e1"
expect_error frag "local_sgd.fragments: 3 does not divide sync_every (4)" \
  "${tr[@]}" "${ns[@]}" --set local_sgd.sync_every=4 --set local_sgd.fragments=3 --set run_dir="$work/e2"
expect_error delay "local_sgd.fragment_sync_delay: 2 must be below sync_every / fragments (2)" \
  "${tr[@]}" "${ns[@]}" --set local_sgd.sync_every=4 --set local_sgd.fragments=2 \
  --set local_sgd.fragment_sync_delay=2 --set run_dir="$work/e3"
expect_error mesh "replica groups of 2 ranks; local_sgd resumes a round only on the same mesh" \
  "${mpirun[@]}" -np 2 "${tr[@]}" "${ns[@]}" --set local_sgd.sync_every=4 \
  --set checkpoint.dir="$work/ck_3" --set checkpoint.resume=auto --set run_dir="$work/e5"
expect_error one "nothing to average" \
  "${mpirun[@]}" -np 2 "${tr[@]}" "${hy[@]}" --set local_sgd.sync_every=4 --set run_dir="$work/e4"

[ ${#failed[@]} = 0 ] || { printf '%s\n' "${failed[@]}"; fail "${#failed[@]} failures"; }
echo "mpi_local_sgd: PASS"
