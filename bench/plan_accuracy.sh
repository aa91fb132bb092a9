#!/usr/bin/env bash
# The planner against `shardwise train`, per configuration: for each row, `shardwise plan
# --json` with a hardware profile calibrated on this machine at that rank count and shapes
# (`plan --calibrate`, cached per config / ranks / micro-batch / precision), then STEPS steps of
# training; beside each other:
#   mem   the device tier's tracked peak: plan + kernel-workspace estimate vs peak_mem_bytes
#         (target within 3%)
#   rss   the process's peak resident set: plan's rss_bytes (tracked + allocator rounding +
#         the calibrated process baseline) vs max(rss_bytes, max_rss_bytes) (target 10%)
#   time  the predicted step vs the median measured step, the first step dropped (target 15%;
#         only where ranks x threads <= the machine's cores, else n/a: oversubscribed ranks
#         time-share cores, which the time model does not model)
#   DS    DeepSpeed's model-states estimate (plan prints it) for comparison
# Measured figures are rank 0's (metrics.jsonl); every rank holds equal shards.
# The "new" column marks rows whose shapes (gpt2m, llamam) were not used while developing the
# RSS model or tuning anything: held out. The load average is printed with each row: on a
# shared machine step times move with it.
#
#   bench/plan_accuracy.sh [BUILD_DIR] [ROWS...]
#   env: STEPS (4), NVME_DIR (a directory on a disk with O_DIRECT for the NVMe rows; default a
#        temporary directory under /tmp)
# ROWS: row names to run (default all). Output: the table and a summary on stdout.
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
sw=$build/tools/shardwise
steps=${STEPS:-4}
cores=$(nproc)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
mpirun=(mpirun --oversubscribe --bind-to none)
work=$(mktemp -d /tmp/sw_plan_accuracy.XXXXXX)
trap 'rm -rf "$work"' EXIT
nvme=${NVME_DIR:-$work/nvme}
mkdir -p "$nvme"
source scripts/fortunes.sh
prepare_fortunes "$sw"

# Shapes. gpt2s / llamas: d=384, 4 layers, T=256 (tuned on); gpt2t / llamat: the tests' tiny
# configs; gpt2m / llamam: held out (not used while developing).
shape() {  # name type vocab layers heads kv d T B
  cat >"$work/$1.json" <<EOF
{"model": {"type": "$2", "vocab_size": $3, "n_layer": $4, "n_head": $5, "n_kv_head": $6,
           "d_model": $7, "seq_len": $8},
 "data": {"train": "data/fortunes_train.bin"}, "train_micro_batch_size_per_gpu": $9,
 "gradient_accumulation_steps": 1, "train_steps": 100, "eval_every_steps": 0,
 "zero_optimization": {"stage": 3}}
EOF
}
shape gpt2s gpt2 50304 4 6 0 384 256 4
shape llamas llama 32000 4 6 2 384 256 4
shape gpt2t gpt2 256 4 4 0 128 128 8
shape llamat llama 256 4 4 2 128 128 8
shape gpt2m gpt2 8192 6 8 0 256 128 6
shape llamam llama 12000 6 10 5 320 192 3

opt_cpu='zero_optimization.offload_optimizer.device="cpu"'
par_cpu='zero_optimization.offload_param.device="cpu"'
opt_nvme="zero_optimization.offload_optimizer.device=\"nvme\" zero_optimization.offload_optimizer.nvme_path=\"$nvme\""
par_nvme="zero_optimization.offload_param.device=\"nvme\" zero_optimization.offload_param.nvme_path=\"$nvme\""
hybrid='sharding_strategy="HYBRID_SHARD" shard_group_size=2'
# name | config | ranks | new (held out) | overrides (space-separated --set values)
rows=(
  "gpt2s-np1-off|gpt2s|1||"
  "gpt2s-np1-full|gpt2s|1||activation_checkpointing=\"full\""
  "gpt2s-np1-sel-optcpu|gpt2s|1||activation_checkpointing=\"selective\" $opt_cpu"
  "gpt2s-np1-bf16|gpt2s|1||bf16.enabled=true"
  "gpt2s-np2-z3|gpt2s|2||"
  "gpt2s-np2-z2|gpt2s|2||zero_optimization.stage=2"
  "gpt2s-np2-z0|gpt2s|2||zero_optimization.stage=0"
  "gpt2s-np2-z1-full|gpt2s|2||zero_optimization.stage=1 activation_checkpointing=\"full\""
  "gpt2s-np2-bpu2-parcpu|gpt2s|2||blocks_per_unit=2 $par_cpu"
  "llamas-np1-off|llamas|1||"
  "llamas-np1-bf16|llamas|1||bf16.enabled=true"
  "llamas-np2-z3-sel|llamas|2||activation_checkpointing=\"selective\""
  "gpt2t-np3-z3-sel|gpt2t|3||activation_checkpointing=\"selective\""
  "gpt2t-np4-hybrid|gpt2t|4||$hybrid"
  "llamat-np2-optnvme|llamat|2||$opt_nvme"
  "gpt2m-np1-bpu3-full|gpt2m|1|new|blocks_per_unit=3 activation_checkpointing=\"full\""
  "gpt2m-np2-bpu3-sel|gpt2m|2|new|blocks_per_unit=3 activation_checkpointing=\"selective\""
  "gpt2m-np4-hybrid-full|gpt2m|4|new|$hybrid activation_checkpointing=\"full\""
  "llamam-np1-acc3|llamam|1|new|train_micro_batch_size_per_gpu=1 gradient_accumulation_steps=3"
  "gpt2m-np1-bf16|gpt2m|1|new|bf16.enabled=true"
  "llamam-np2-z2-optcpu|llamam|2|new|zero_optimization.stage=2 $opt_cpu"
  "llamam-np3-parnvme|llamam|3|new|$par_nvme $opt_nvme"
  "gpt2s-np1-bf16-ckpt|gpt2s|1||bf16.enabled=true checkpoint.every_steps=2"
  "llamam-np2-ckpt-async|llamam|2|new|checkpoint.every_steps=2 checkpoint.async=true"
)
want=("$@")

results=$work/results.tsv
: >"$results"
printf "%-22s %2s %-3s | %8s %8s %6s | %8s %8s %6s | %8s | %8s %8s %6s | %5s\n" row np new \
  mem_pred mem_meas err% rss_pred rss_meas err% DS_MiB t_pred t_meas err% load
for row in "${rows[@]}"; do
  IFS='|' read -r name cfg np new ov <<<"$row"
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" $name "* ]]; then continue; fi
  sets=()
  for kv in $ov; do sets+=(--set "$kv"); done
  launch=()
  [ "$np" -gt 1 ] && launch=("${mpirun[@]}" -np "$np")
  # One profile per config, rank count, micro-batch and precision, calibrated before its first
  # row (the shapes the config's calls have at that micro-batch; the process baseline).
  mb=$(sed -n 's/.*train_micro_batch_size_per_gpu=\([0-9]*\).*/\1/p' <<<"$ov")
  key="${cfg}_np${np}_mb${mb:-d}_$([[ $ov == *bf16* ]] && echo bf16 || echo f32)"
  hw="$work/hw_$key.json"
  if [ ! -f "$hw" ]; then
    "${launch[@]}" "$sw" plan "$work/$cfg.json" "${sets[@]}" --calibrate --out-hardware "$hw" \
      >"$work/cal_$key.log" 2>&1 || { cat "$work/cal_$key.log"; exit 1; }
  fi
  "$sw" plan "$work/$cfg.json" "${sets[@]}" --world-size "$np" --hardware "$hw" --json \
    >"$work/plan_$name.json"
  rm -rf "$work/run_$name"
  "${launch[@]}" "$sw" train "$work/$cfg.json" "${sets[@]}" --set train_steps="$steps" \
    --set run_dir="\"$work/run_$name\"" >"$work/train_$name.log" 2>&1 ||
    { cat "$work/train_$name.log"; exit 1; }
  load=$(cut -d' ' -f1 /proc/loadavg)
  python3 - "$name" "$np" "${new:--}" "$work/plan_$name.json" "$work/run_$name/metrics.jsonl" \
    "$load" "$cores" "$results" <<'PY'
import json, statistics, sys
name, np_, new, plan_path, metrics_path, load, cores, results = sys.argv[1:]
np_, cores = int(np_), int(cores)
j = json.load(open(plan_path)); r = j["ranks"][0]
m = [json.loads(l) for l in open(metrics_path) if '"step_time_s"' in l]
mem_p = r["tiers"]["device"]["peak_bytes"]  # (the plan's peak + the kernel workspace)
mem_m = max(x["peak_mem_bytes"] for x in m)
rss_p = r["rss_bytes"]
rss_m = max(max(x.get("rss_bytes", 0), x.get("max_rss_bytes", 0)) for x in m)
ds = j["deepspeed_estimate"]["bytes"]
threads = max(1, cores // np_)  # the trainer's default: cores / ranks on the node
timed = np_ * threads <= cores and np_ <= cores
t_p = j["step_time"]["step_time_s"] if j["step_time"] else None
t_m = statistics.median(x["step_time_s"] for x in m[1:]) if len(m) > 1 else None
err = lambda p, q: 100.0 * (p - q) / q
M = 2.0**20
t_cols = ("%8.3f %8.3f %+6.1f" % (t_p, t_m, err(t_p, t_m))) if timed and t_p and t_m else \
         ("%8s %8s %6s" % ("n/a", "n/a" if t_m is None else "%.3f" % t_m, "n/a"))
print("%-22s %2d %-3s | %8.1f %8.1f %+6.2f | %8.1f %8.1f %+6.2f | %8.1f | %s | %5s" %
      (name, np_, new, mem_p / M, mem_m / M, err(mem_p, mem_m), rss_p / M, rss_m / M,
       err(rss_p, rss_m), ds / M, t_cols, load), flush=True)
with open(results, "a") as f:
    f.write("\t".join(map(str, [name, new, mem_p, mem_m, rss_p, rss_m,
                                t_p if timed else "", t_m if timed else ""])) + "\n")
PY
done

python3 - "$results" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
def summary(sel, label):
    if not sel: return
    for metric, pi, mi, target in (("mem", 2, 3, 3.0), ("rss", 4, 5, 10.0), ("time", 6, 7, 15.0)):
        pairs = [(r[0], float(r[pi]), float(r[mi])) for r in sel if r[pi] and r[mi]]
        if not pairs:
            continue
        errs = [(n, 100.0 * (p - m) / m) for n, p, m in pairs]
        worst = max(errs, key=lambda e: abs(e[1]))
        under = sum(1 for _, e in errs if e < 0)
        within = sum(1 for _, e in errs if abs(e) <= target)
        print("%-9s %-5s rows %2d  within %4.1f%%: %2d  worst %+6.2f%% (%s)  under-estimates %d/%d" %
              (label, metric, len(errs), target, within, worst[1], worst[0], under, len(errs)))
print("summary (error = (predicted - measured) / measured):")
summary(rows, "all")
summary([r for r in rows if r[1] == "new"], "held-out")
PY
