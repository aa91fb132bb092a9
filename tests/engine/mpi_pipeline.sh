#!/bin/bash
# Pipeline parallelism end to end (issue 37, label mpi): `mpirun -np 2|4 shardwise train` with
# parallelism.pipeline_parallel_degree 2 against one rank of the same config and global batch.
# Usage: mpi_pipeline.sh SHARDWISE MPIEXEC [mpirun flags...]
#
# A 4-layer GPT-2 (d_model 64, 4 heads, vocabulary 128 of byte text, seq_len 32, tied embedding
# and head on the first and the last stage) and a Llama with grouped-query attention, 4 steps of
# 4 micro-batches (gradient_accumulation_steps, the pipeline's micro-batches), validation at the
# end: every schedule at 2 stages (GPipe, 1F1B, Interleaved1F1B and InterleavedZeroBubble with 2
# stages per rank); 2 stages x FULL_SHARD 2, x HYBRID_SHARD (replicas of 1), x NO_SHARD, x
# SHARD_GRAD_OP, x ZeRO-1, x tensor 2 on 4 ranks (micro-batch 1: the same rows); activation
# checkpointing full; bf16 and fp16 with loss scaling (against one rank's run in that
# precision: the scaler sees the norm over every stage); hand-placed split points. Every step's loss and grad_norm and the validation loss
# agree with the one-rank run within 1e-5 relative (fp32; bf16 5e-4 and 5e-3, as mpi_tensor.sh
# explains), and each step counts its tokens once. Errors, one line each: a world the degrees do
# not divide, more stages than schedule positions, split points of the wrong count, virtual
# stages without an interleaved schedule, an interleaved schedule whose micro-batches the degree
# does not divide. A stage that dies mid-run: the other's watchdog names it and the job ends.
# sample and eval of the pipelined run's export: the whole model on one rank, one note.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/mpi_common.sh" mpi_pipeline "$@"
py=/usr/bin/python3

prepare_text 2000
export OMP_NUM_THREADS=1

config() {  # file, model block
  cat >"$1" <<JSON
{
  "model": $2,
  "data": {"train": "$work/train.bin", "val": "$work/val.bin"},
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "train_steps": 4,
  "eval_batches": 2, "log_every_steps": 4, "threads": 1, "comm_timeout_s": 60,
  "optimizer": {"params": {"lr": 0.003}}, "gradient_clipping": 1.0
}
JSON
}
config "$work/gpt2.json" '{"type": "gpt2", "vocab_size": 128, "n_layer": 4, "n_head": 4,
  "d_model": 64, "seq_len": 32}'
config "$work/llama.json" '{"type": "llama", "vocab_size": 128, "n_layer": 4, "n_head": 4,
  "n_kv_head": 2, "d_model": 64, "seq_len": 32}'

run() {  # name, ranks, model, --set overrides... (exports only gpt2.pp2_1F1B)
  local name=$1 np=$2 model=$3
  shift 3
  local ex=(--no-export)
  [ "$name" = gpt2.pp2_1F1B ] && ex=()
  local cmd=("$sw" train "$work/$model.json" --quiet "${ex[@]}" --set run_dir="$work/$name" "$@")
  local launch=()
  [ "$np" = 1 ] || launch=("${mpirun[@]}" -np "$np")
  local rc=0
  timeout 120 "${launch[@]}" "${cmd[@]}" >"$work/$name.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || failed+=("$name: exit status $rc: $(grep -m1 'error' "$work/$name.log")")
}
failed=()
pp=(--set parallelism.pipeline_parallel_degree=2)
sched() { echo "--set parallelism.pipeline_parallel_schedule=$1"; }
d2=(--set train_micro_batch_size_per_gpu=1)
specs=()
for m in gpt2 llama; do
  run "$m.ref" 1 $m
  for s in GPipe 1F1B Interleaved1F1B InterleavedZeroBubble; do
    run "$m.pp2_$s" 2 $m "${pp[@]}" $(sched $s)
    specs+=("$m.pp2_$s:$m.ref")
  done
  run "$m.pp2_full2" 4 $m "${pp[@]}" "${d2[@]}" --set sharding_strategy=FULL_SHARD
  run "$m.pp2_t2" 4 $m "${pp[@]}" --set parallelism.tensor_parallel_degree=2
  run "$m.pp2_acfull" 2 $m "${pp[@]}" --set activation_checkpointing=full
  specs+=("$m.pp2_full2:$m.ref:noval" "$m.pp2_t2:$m.ref" "$m.pp2_acfull:$m.ref")
done
run gpt2.ref_bf16 1 gpt2 --set bf16.enabled=true
run gpt2.pp2_bf16 2 gpt2 "${pp[@]}" --set bf16.enabled=true
run gpt2.pp2_hybrid1 4 gpt2 "${pp[@]}" "${d2[@]}" --set sharding_strategy=HYBRID_SHARD \
  --set shard_group_size=1
run gpt2.pp2_split 2 gpt2 "${pp[@]}" --set 'parallelism.pipeline_parallel_split_points=[2]'
run gpt2.pp2_noshard 4 gpt2 "${pp[@]}" "${d2[@]}" --set sharding_strategy=NO_SHARD
run gpt2.pp2_gradop 4 gpt2 "${pp[@]}" "${d2[@]}" --set sharding_strategy=SHARD_GRAD_OP \
  $(sched Interleaved1F1B)
run gpt2.pp2_zero1 4 gpt2 "${pp[@]}" "${d2[@]}" --set zero_optimization.stage=1 \
  $(sched InterleavedZeroBubble)
run gpt2.ref_fp16 1 gpt2 --set fp16.enabled=true
run gpt2.pp2_fp16 2 gpt2 "${pp[@]}" --set fp16.enabled=true
specs+=(gpt2.pp2_bf16:gpt2.ref_bf16 gpt2.pp2_hybrid1:gpt2.ref:noval gpt2.pp2_split:gpt2.ref
  gpt2.pp2_noshard:gpt2.ref:noval gpt2.pp2_gradop:gpt2.ref:noval gpt2.pp2_zero1:gpt2.ref:noval
  gpt2.pp2_fp16:gpt2.ref_fp16)
grep -q "stage bounds (schedule positions) 0 2 6" "$work/gpt2.pp2_split.log" ||
  failed+=("pp2_split: the stage bounds are not the split point's: $(grep -m1 'stage bounds' "$work/gpt2.pp2_split.log")")

# "auto": the planner chooses the degree, schedule and micro-batch size and count within
# memory_budget (the global batch kept); the run's tracked peak stays within the budget.
budget=3000000
run gpt2.auto 2 gpt2 --set 'parallelism.pipeline_parallel_degree="auto"' \
  --set memory_budget=$budget --set zero_optimization.stage=0
"$py" - "$work/gpt2.auto" $budget <<'PY' || failed+=("auto: $(grep -m1 'auto:' "$work/gpt2.auto.log")")
import json, sys
d, budget = sys.argv[1], int(sys.argv[2])
c = json.load(open(f"{d}/config.json"))
m = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
p = c["parallelism"]
glob = c["train_micro_batch_size_per_gpu"] * c["gradient_accumulation_steps"] * (2 // p["pipeline_parallel_degree"])
peak = max(x["peak_mem_bytes"] for x in m)
print(f"mpi_pipeline: auto chose pipeline {p['pipeline_parallel_degree']} {p['pipeline_parallel_schedule']}"
      f" micro-batch {c['train_micro_batch_size_per_gpu']} x {c['gradient_accumulation_steps']};"
      f" peak {peak} <= {budget}")
assert p["pipeline_parallel_degree"] in (1, 2), p
assert glob == 16, f"global batch {glob}, expected 16 (2 rows x 4 micro-batches x 2 ranks)"
assert peak <= budget, f"peak {peak} above the budget {budget}"
PY
grep -q '^auto: memory_budget' "$work/gpt2.auto.log" || failed+=("auto: no choice line")

# (micro-batch 1 x 2 data-parallel ranks evaluate other windows than one rank with micro-batch
# 2: those runs skip the validation loss)
"$py" - "$work" "${specs[@]}" <<'PY' || failed+=("parity")
import json, sys
work, specs = sys.argv[1], sys.argv[2:]
def metrics(run):
    try:
        return [json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl")]
    except OSError:
        return None
bad = []
for spec in specs:
    run, ref, *flags = spec.split(":")
    m, r = metrics(run), metrics(ref)
    if m is None or r is None:
        bad.append(f"{run if m is None else ref}: no metrics.jsonl (the run failed)")
        continue
    bf16 = run.endswith("bf16") or run.endswith("fp16")
    tols = {"loss": 5e-4, "grad_norm": 5e-3, "val_loss": 5e-4} if bf16 else \
           {"loss": 1e-5, "grad_norm": 1e-5, "val_loss": 1e-5}
    if "noval" in flags:
        del tols["val_loss"]
    if len(m) != len(r):
        bad.append(f"{run}: {len(m)} metrics lines, expected {len(r)}")
        continue
    worst = {k: 0.0 for k in tols}
    for a, b in zip(m, r):
        for key, tol in tols.items():
            if key not in b:
                continue
            if a.get(key) is None:
                bad.append(f"{run} step {b['step']}: no {key}")
                continue
            rel = abs(a[key] - b[key]) / abs(b[key])
            worst[key] = max(worst[key], rel)
            if rel > tol:
                bad.append(f"{run} step {b['step']}: {key} {a[key]} vs one rank {b[key]} "
                           f"(relative {rel:.2e} > {tol})")
        toks = a["tokens_per_s"] * a["step_time_s"]
        if abs(toks - 256) > 1e-3 * 256:
            bad.append(f"{run} step {a['step']}: tokens_per_s * step_time_s = {toks:.2f}, "
                       "expected 256 (each token counted once)")
    print(f"mpi_pipeline: {run:28s} vs {ref:13s} worst relative " +
          " ".join(f"{k} {v:.1e}" for k, v in worst.items()))
if bad:
    print("\n".join(bad))
    sys.exit(1)
PY

# eval and sample of the 2-stage run's export run the whole model on one rank with one note:
# the output is the same as without the degree.
for cmd in sample eval; do
  args=(--weights "$work/gpt2.pp2_1F1B/hf")
  if [ $cmd = sample ]; then args+=(--config "$work/gpt2.json" --tokens 16 --temperature 0);
  else args=("$work/gpt2.json" "${args[@]}" --data "$work/val.bin"); fi
  "$sw" $cmd "${args[@]}" "${pp[@]}" >"$work/$cmd.p2.out" 2>"$work/$cmd.p2.err" ||
    failed+=("$cmd with a pipeline degree: exit status $?: $(head -2 "$work/$cmd.p2.err")")
  "$sw" $cmd "${args[@]}" >"$work/$cmd.p1.out" 2>/dev/null || failed+=("$cmd: exit status $?")
  cmp -s "$work/$cmd.p1.out" "$work/$cmd.p2.out" || failed+=("$cmd: output differs with a degree")
  [ "$(grep -c "runs the whole model on one rank" "$work/$cmd.p2.err")" = 1 ] ||
    failed+=("$cmd: not one note: $(head -2 "$work/$cmd.p2.err")")
done

expect_error() {  # name, expected text, command...
  local name=$1 text=$2
  shift 2
  if timeout 60 "$@" >"$work/$name.log" 2>&1; then cat "$work/$name.log"; fail "$name: exit 0"; fi
  grep -qF -- "$text" "$work/$name.log" || { cat "$work/$name.log"; fail "$name: no '$text'"; }
  [ "$(grep -c "error" "$work/$name.log")" -ge 1 ] || fail "$name: no error line"
}
tr1=("$sw" train "$work/gpt2.json" --quiet --no-export)
expect_error world3 "parallelism.pipeline_parallel_degree: 2 does not divide the world size (3 ranks)" \
  "${mpirun[@]}" -np 3 "${tr1[@]}" "${pp[@]}" --set run_dir="$work/world3"
expect_error stages "parallelism.pipeline_parallel_degree: 8 stages need as many schedule positions; the model has 6" \
  "${mpirun[@]}" -np 2 "${tr1[@]}" "${pp[@]}" --set parallelism.pipeline_parallel_virtual_stages=4 \
  $(sched Interleaved1F1B) --set run_dir="$work/stages"
expect_error split "parallelism.pipeline_parallel_split_points: 2 stages need 1 split points, got 2" \
  "${tr1[@]}" "${pp[@]}" --set 'parallelism.pipeline_parallel_split_points=[2,4]' --set run_dir="$work/split"
expect_error virtual "parallelism.pipeline_parallel_virtual_stages: more than one stage per rank needs an interleaved schedule" \
  "${tr1[@]}" "${pp[@]}" --set parallelism.pipeline_parallel_virtual_stages=2 --set run_dir="$work/virtual"
expect_error accum "gradient_accumulation_steps: an interleaved schedule runs micro-batches in groups of the pipeline degree (2), got 3" \
  "${tr1[@]}" "${pp[@]}" $(sched Interleaved1F1B) --set gradient_accumulation_steps=3 --set run_dir="$work/accum"

# A stage that dies: rank 1 is killed during training; rank 0's watchdog names it (the p2p
# transport's or a collective's line, whichever waits first) and the job ends, no hang.
t0=$(date +%s)
out=$(timeout -k 5 60 "${mpirun[@]}" --mca orte_abort_on_non_zero_status 0 -np 2 \
  bash -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then (sleep 3; kill -9 $$) & fi; exec "$@"' _ \
  "${tr1[@]}" "${pp[@]}" --set train_steps=100000 --set comm_timeout_s=3 \
  --set run_dir="$work/dead" 2>&1)
rc=$? dt=$(( $(date +%s) - t0 ))
# (mpirun's status is the killed rank's, 137, or the abort's; a hang is the 60 s limit)
if [ $rc = 0 ] || [ $dt -ge 60 ]; then
  failed+=("dead stage: exit status $rc after $dt s (expected the watchdog to end the job)")
elif ! grep -qE "rank 1 (is not responding|has not posted)|ranks not reached: \[1\]|rank 1: no answer" <<<"$out"; then
  failed+=("dead stage: no watchdog line naming rank 1: $(grep -m2 -E 'shardwise|p2p' <<<"$out")")
else
  echo "mpi_pipeline: dead stage: ended after $dt s: $(grep -m1 -E 'not responding|has not posted|ranks not reached' <<<"$out")"
fi

[ ${#failed[@]} = 0 ] || { printf '%s\n' "${failed[@]}"; fail "${#failed[@]} failures"; }
echo "mpi_pipeline: PASS"
