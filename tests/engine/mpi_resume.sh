#!/bin/bash
# `mpirun -np 2 shardwise train` stopped at step 4 and resumed to step 8 against the
# uninterrupted 2-rank run (label mpi), with sync and async saves, and under mixed precision
# (bf16 with stage 1, whose persistent full buffer is a rounded compute copy beside the fp32
# master; fp16 with NO_SHARD and a loss scale that overflows, so the scaler's state and the
# count of applied optimizer steps must survive the resume): every step's loss, grad norm and
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
  cmp "$work/full_$async/hf/model.safetensors" "$work/half_$async/hf/model.safetensors" ||
    fail "async=$async: the resumed run's weights differ from the uninterrupted run's"
  /usr/bin/python3 - "$work/full_$async/metrics.jsonl" "$work/half_$async/metrics.jsonl" <<'PY' || fail "async=$async: metrics differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 8, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("step", "loss", "grad_norm", "lr"):
        assert x[k] == y[k], (x["step"], k, x[k], y[k])
    if x["step"] > 4:  # the stopped run also validated at its last step, 4
        assert x.get("val_loss") == y.get("val_loss"), (x["step"], x.get("val_loss"), y.get("val_loss"))
PY
  if [ "$async" = fp16_stage0 ]; then
    grep -q '"overflow":true' "$work/full_$async/metrics.jsonl" ||
      fail "fp16_stage0: no step overflowed, so the loss scaler's resume is not exercised"
  fi
done
echo "mpi_resume: OK (2 ranks; sync, async, bf16 stage 1, fp16 NO_SHARD with overflows: losses and weights identical after resume)"
