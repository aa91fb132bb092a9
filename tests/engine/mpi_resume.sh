#!/bin/bash
# `mpirun -np 2 shardwise train` stopped at step 4 and resumed to step 8 against the
# uninterrupted 2-rank run (label mpi), with sync and async saves, and under mixed precision
# (bf16 with stage 1, whose persistent full buffer is a rounded compute copy beside the fp32
# master; fp16 with NO_SHARD and a loss scale that overflows, so the scaler's state and the
# count of applied optimizer steps must survive the resume; bf16 with release_grads, whose
# gradients are freed between steps): every step's loss, grad norm and
# validation loss, and the exported weights, must be identical.
# Usage: mpi_resume.sh SHARDWISE MPIEXEC [mpirun flags...]
# "Stopped at step 4" is a run of train_steps 4 whose LR schedule is that of 8 steps
# (scheduler total_num_steps 8); the kill tests (test_ckpt_kill) cover real kills.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/mpi_common.sh" mpi_resume "$@"
prepare_text 3000
cat >"$work/cfg.json" <<EOF
{
  "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 2, "n_head": 2, "d_model": 32,
            "seq_len": 16},
  "data": {"train": "$work/train.bin", "val": "$work/val.bin"},
  "train_micro_batch_size_per_gpu": 2, "train_steps": 8, "eval_every_steps": 3,
  "eval_batches": 2, "threads": 1,
  "optimizer": {"params": {"lr": 0.003}},
  "scheduler": {"params": {"warmup_num_steps": 2, "total_num_steps": 8}},
  "checkpoint": {"every_steps": 2}
}
EOF
export OMP_NUM_THREADS=1
run2() {  # run name, args...
  local name=$1
  shift
  timeout 120 "${mpirun[@]}" -np 2 "$sw" train "$work/cfg.json" --quiet --set run_dir="$work/$name" "$@" \
    >>"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name: exit status $?"; }
}
variants=(
  "sync|--set checkpoint.async=false"
  "async|--set checkpoint.async=true"
  "bf16_stage1|--set bf16.enabled=true --set zero_optimization.stage=1"
  "bf16_release_grads|--set bf16.enabled=true --set release_grads=true"
  "fp16_stage0|--set fp16.enabled=true --set fp16.initial_scale_power=24 --set fp16.loss_scale_window=2 --set zero_optimization.stage=0"
)
for v in "${variants[@]}"; do
  async=${v%%|*}
  read -r -a vargs <<<"${v#*|}"
  run2 full_$async "${vargs[@]}"
  run2 half_$async "${vargs[@]}" --set train_steps=4
  run2 half_$async "${vargs[@]}" --resume auto
  grep -q "resumed from $work/half_$async/checkpoints/step_4 at step 4" "$work/half_$async.log" ||
    { cat "$work/half_$async.log"; fail "half_$async: no 'resumed from' line"; }
  # Metrics and weights compared together, so that a failure says how the runs diverged: the
  # steps whose figures differ, and per tensor the count of differing elements and the largest
  # difference (one element in the last bits of an fp32 master, or the whole model).
  PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")/../common" /usr/bin/python3 - "$work" "$async" <<'PY' || fail "async=$async: the resumed run differs from the uninterrupted one (above)"
import sys
import numpy as np
import run_files
work, v = sys.argv[1], sys.argv[2]
bad = []
a, b = run_files.metrics(work, f"full_{v}"), run_files.metrics(work, f"half_{v}")
if not len(a) == len(b) == 8:
    bad.append(f"metrics: {len(a)} and {len(b)} lines, 8 expected")
for x, y in zip(a, b):
    keys = ["step", "loss", "grad_norm", "lr"] + (["val_loss"] if x["step"] > 4 else [])
    for k in keys:  # (the stopped run also validated at its last step, 4)
        if x.get(k) != y.get(k):
            bad.append(f"step {x['step']} {k}: {x.get(k)!r} uninterrupted, {y.get(k)!r} resumed")
wa, wb = run_files.weights(work, f"full_{v}"), run_files.weights(work, f"half_{v}")
if sorted(wa) != sorted(wb):
    bad.append(f"weights: tensors {sorted(wa)} and {sorted(wb)}")
for k in sorted(set(wa) & set(wb)):
    x, y = wa[k], wb[k]
    if x.size != y.size:
        bad.append(f"weights {k}: {x.size} and {y.size} elements")
        continue
    diff = np.flatnonzero(x.view(np.uint32) != y.view(np.uint32))
    if diff.size:
        big = float(np.max(np.abs(x[diff].astype(np.float64) - y[diff])))
        bad.append(f"weights {k}: {diff.size} of {x.size} elements differ "
                   f"(first at {diff[0]}, largest difference {big:.3g})")
for line in bad:
    print("  " + line)
sys.exit(1 if bad else 0)
PY
  cmp -s "$work/full_$async/hf/model.safetensors" "$work/half_$async/hf/model.safetensors" ||
    fail "async=$async: the exported files differ (their tensors do not)"
  if [ "$async" = fp16_stage0 ]; then
    grep -q '"overflow":true' "$work/full_$async/metrics.jsonl" ||
      fail "fp16_stage0: no step overflowed, so the loss scaler's resume is not exercised"
  fi
done
echo "mpi_resume: OK (2 ranks; sync, async, bf16 stage 1, bf16 with release_grads, fp16 NO_SHARD with overflows: losses and weights identical after resume)"
