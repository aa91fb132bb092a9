#!/bin/bash
# Every kind of choice `shardwise plan --memory-budget` makes runs as written (label mpi, issue
# 42): for budgets that force host and NVMe optimizer state, CPU and NVMe parameters, CPU and
# NVMe activations, checkpointing and accumulation, `plan --out` writes the chosen config, the
# chosen plan is of that kind, `mpirun -np 2 shardwise train` trains 2 steps of it as written,
# and the tracked device peak it measures (metrics.jsonl peak_mem_bytes) is within the budget.
# Budgets are fractions of the unconstrained plan's figures (`plan --json`: the device peak and
# its categories), so they follow the planner rather than rot. Small GPT-2s: one whose state
# dominates (the state offloads), two whose activations do (the rest).
# Usage: mpi_plan_choices.sh SHARDWISE MPIEXEC [mpirun flags...]
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../engine/mpi_common.sh" mpi_plan_choices "$@"
prepare_text 2000
mkdir -p "$work/nv"
# Round figures of a machine whose host tier is across a link (the "host" block: host offload
# costs link time and a slower AdamW), written here so the choices do not depend on this one.
# link.json: the host link fast, the disk slow; disk.json: the link slow, the disk fast.
hw() {
  cat >"$work/$1.json" <<EOF
{"name": "$1", "world_size": 2, "threads": 1,
 "compute": {"gemm_flops": {"f32": 5e10, "bf16": 5e10}, "elementwise_bytes_per_s": 1e10,
             "optimizer_floats_per_s": 1e9},
 "collectives": {"all_gather": {"latency_s": 2e-5, "busbw_bytes_per_s": 5e9},
                 "reduce_scatter": {"latency_s": 2e-5, "busbw_bytes_per_s": 5e9},
                 "all_reduce": {"latency_s": 2e-5, "busbw_bytes_per_s": 5e9}},
 "disk": {"read_bytes_per_s": $3, "write_bytes_per_s": $3, "latency_s": 1e-4},
 "host": {"link_bytes_per_s": $2, "optimizer_floats_per_s": 5e8}}
EOF
}
hw link 1e10 5e8
hw disk 1e8 1e10
# model NAME LAYERS SEQ MICRO_BATCH ACCUM: a GPT-2 (V 256, d 64, 2 heads) training 2 steps.
model() {
  cat >"$work/$1.json" <<EOF
{"model": {"type": "gpt2", "vocab_size": 256, "n_layer": $2, "n_head": 2, "d_model": 64,
           "seq_len": $3},
 "data": {"train": "$work/train.bin"}, "train_micro_batch_size_per_gpu": $4,
 "gradient_accumulation_steps": $5, "train_steps": 2, "threads": 1, "log_every_steps": 1,
 "zero_optimization": {"stage": 3}, "run_dir": "$work/run"}
EOF
}
model state 12 16 2 1   # parameters and optimizer state dominate
model acts 4 256 1 1    # activations dominate, one sequence per rank: no accumulation possible
model batch 4 128 8 1   # activations dominate, 8 sequences per rank
for m in state acts batch; do
  "$sw" plan "$work/$m.json" --world-size 2 --json >"$work/$m.plan.json" || fail "plan --json $m"
done
# budget MODEL EXPR: bytes from the unconstrained plan's device tier (rank 0): EXPR in D (the
# device peak), P, G, O, A (its params, grads, optimizer and activations at the peak).
budget() {
  /usr/bin/python3 - "$work/$1.plan.json" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["ranks"][0]["tiers"]["device"]
c = d["categories"]
env = {"D": d["peak_bytes"], "P": c.get("params", 0), "G": c.get("grads", 0),
       "O": c.get("optimizer", 0), "A": c.get("activations", 0)}
print(int(eval(sys.argv[2], {}, env)))
PY
}
n=0
# choice NAME MODEL HARDWARE KIND DEVICE_EXPR [plan flags...]: search, check the kind, train,
# check the peak.
choice() {
  local name=$1 model=$2 hw=$3 kind=$4 b
  b=$(budget "$model" "$5") || fail "$name: budget"
  shift 5
  "$sw" plan "$work/$model.json" --world-size 2 --hardware "$work/$hw.json" --memory-budget "$b" \
    "$@" --out "$work/$name.json" >"$work/$name.plan.log" 2>&1 ||
    { cat "$work/$name.plan.log"; fail "$name: plan exit status"; }
  local chosen
  chosen=$(sed -n 's/^chosen plan: //p' "$work/$name.plan.log")
  grep -q "^  rule: among the plans that fit" "$work/$name.plan.log" || fail "$name: no rule printed"
  # The kind the budget forces, in the chosen plan's description (an extended regex).
  [[ " $chosen " =~ $kind ]] ||
    { cat "$work/$name.plan.log"; fail "$name: budget $b chose '$chosen', not /$kind/"; }
  rm -rf "$work/run"
  timeout 120 "${mpirun[@]}" -np 2 "$sw" train "$work/$name.json" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.json" "$work/$name.log"; fail "$name: '$chosen' did not train as written"; }
  /usr/bin/python3 - "$work/run/metrics.jsonl" "$b" "$name" "$chosen" <<'PY' || fail "$name: peak"
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
budget = int(sys.argv[2])
assert len(steps) == 2, steps
peak = max(s["peak_mem_bytes"] for s in steps)
assert 0 < peak <= budget, ("tracked peak over the budget", peak, budget)
print("mpi_plan_choices: %-10s budget %9d  peak %9d  %s" % (sys.argv[3], budget, peak, sys.argv[4]))
PY
  n=$((n + 1))
}
nv=(--nvme-path "$work/nv")
half_opt=$(budget state '0.6 * O')  # host room for half the optimizer state only
choice opt_cpu    state link ' opt=cpu'      'D - 0.75 * O' --host-budget "$half_opt"
choice opt_nvme   state link ' opt=nvme'     'D - O' --host-budget 1 "${nv[@]}"
choice param_cpu  state link ' param=cpu'    'D - O - P'
choice param_nvme state link ' param=nvme'   'D - O - P' --host-budget 1 "${nv[@]}"
choice act_cpu    acts  link ' act=cpu'      'D - 0.6 * A'
choice act_nvme   acts  disk ' act=nvme'     'D - 0.55 * A' --host-budget 1 "${nv[@]}"
choice ckpt       acts  disk ' ckpt=(full|selective) ' 'D - 0.55 * A' --host-budget 1
choice accum      batch link ' mb=[1-4]x[2-8] ' 'D - 0.6 * A'
echo "mpi_plan_choices: OK ($n plans trained)"
