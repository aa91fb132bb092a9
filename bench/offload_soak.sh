#!/usr/bin/env bash
# Issue 10's "bounded memory" and issue 13's soak: a long `shardwise train` run with everything
# offloaded to NVMe under DIR (parameters and gradients, AdamW's moments, activations) and an
# asynchronous checkpoint every CKPT_EVERY steps, 2 ranks x 1 thread, reporting each rank's
# resident set (sampled by ps every second), rank 0's open descriptors and tracked peak (from
# metrics.jsonl) over time: after warm-up (the first WARM steps) nothing may grow by more than
# 1% (RSS) or at all (descriptors).
#
#   bench/offload_soak.sh DIR [BUILD_DIR]    env: STEPS (500), CKPT_EVERY (50),
#                                            WARM (CKPT_EVERY + 10: after the first save),
#                                            OFFLOAD (all; optimizer: AdamW's moments alone,
#                                            their updates deferred into the next forward;
#                                            none: no offload, so the checkpoints really are
#                                            asynchronous: with state on NVMe they are streamed
#                                            synchronously from its files)
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: bench/offload_soak.sh DIR [BUILD_DIR]}
build=${2:-build}
sw=$(realpath "$build/tools/shardwise")
steps=${STEPS:-500} every=${CKPT_EVERY:-50} warm=${WARM:-$(( ${CKPT_EVERY:-50} + 10 ))}
work=$(mktemp -d /tmp/sw_soak.XXXXXX)
trap 'rm -rf "$work"; [ -n "${sampler:-}" ] && kill $sampler 2>/dev/null || true' EXIT
mkdir -p "$dir"
source scripts/fortunes.sh
prepare_fortunes "$sw"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(configs/llama_tiny.json --quiet --no-export --set train_steps="$steps" --set threads=1
      --set eval_every_steps=0 --set run_dir="$work/run"
      --set checkpoint.every_steps="$every" --set checkpoint.async=true --set checkpoint.keep_last=2
      --set activation_checkpointing.mode=selective)
case ${OFFLOAD:-all} in
  all) args+=(--set zero_optimization.offload_param.device=nvme
              --set zero_optimization.offload_param.nvme_path="$dir"
              --set zero_optimization.offload_optimizer.device=nvme
              --set zero_optimization.offload_optimizer.nvme_path="$dir"
              --set activation_checkpointing.offload=nvme) ;;
  optimizer) args+=(--set zero_optimization.offload_optimizer.device=nvme
                    --set zero_optimization.offload_optimizer.nvme_path="$dir") ;;
  none) ;;
  *) echo "offload_soak: OFFLOAD=$OFFLOAD: expected all, optimizer or none" >&2; exit 2 ;;
esac
# Each second: the step reached (lines of metrics.jsonl) and the RSS of this run's ranks.
( while sleep 1; do
    n=$(cat "$work/run/metrics.jsonl" 2>/dev/null | wc -l)
    for pid in $(pgrep -f "run_dir=$work/run"); do
      [ "$(cat /proc/$pid/comm 2>/dev/null)" = shardwise ] || continue
      echo "$n $pid $(awk '/VmRSS/{print $2}' /proc/$pid/status 2>/dev/null)"
    done
  done ) > "$work/rss.txt" &
sampler=$!
t0=$(date +%s)
mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$sw" train "${args[@]}"
t1=$(date +%s)
kill $sampler; sampler=
echo "offload_soak: OFFLOAD=${OFFLOAD:-all}, $steps steps in $((t1 - t0)) s, checkpoint every $every steps (async), warm-up $warm steps"
/usr/bin/python3 - "$work" "$warm" "$steps" "$every" <<'PY'
import json, sys, collections
work, warm, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
m = [json.loads(l) for l in open(f"{work}/run/metrics.jsonl")]
by = collections.defaultdict(list)
for line in open(f"{work}/rss.txt"):
    f = line.split()
    if len(f) == 3 and f[2].isdigit():
        by[f[1]].append((int(f[0]), int(f[2]) * 1024))
def pct(a, b): return 100.0 * (b - a) / a
after = [x for x in m if x["step"] > warm]
ok = True
print(f"  rank 0 (metrics.jsonl)   after warm-up: step {after[0]['step']} .. {after[-1]['step']}")
for key in ("rss_bytes", "max_rss_bytes", "peak_mem_bytes", "open_fds"):
    v = [x[key] for x in after]
    g = pct(v[0], max(v))
    print(f"  {key:16s} first {v[0]:>12,}  max {max(v):>12,}  last {v[-1]:>12,}  growth {g:+.2f}%")
    if key != "open_fds":
        ok &= g <= 1.0
        continue
    # An asynchronous save holds its files open while it writes, during the steps after it
    # starts: compare the steps just before each save (none in flight) for a leak.
    q = [x[key] for x in after if x["step"] % every == every - 1]
    if q:
        print(f"  {'':16s} before each save: first {q[0]:>6,}  max {max(q):>6,}  last {q[-1]:>6,}"
              f"  ({len(q)} samples; above: an async save's files open during it)")
        ok &= max(q) <= q[0]
    else:
        ok &= max(v) <= v[0]
for r, (pid, s) in enumerate(sorted(by.items())):
    body = [rss for step, rss in s if warm < step < steps]  # after warm-up, before teardown
    if not body:
        continue
    g = pct(body[0], max(body))
    print(f"  rank pid {pid} VmRSS ({len(body)} samples, steps {warm + 1}..{steps - 1}): first "
          f"{body[0] / 2**20:.1f} MiB, max {max(body) / 2**20:.1f} MiB, last {body[-1] / 2**20:.1f} MiB, "
          f"growth {g:+.2f}%")
    ok &= g <= 1.0
# The curve: rank 0's RSS (metrics.jsonl) at ten points after warm-up, and at each checkpoint.
pts = [after[min(len(after) - 1, i * (len(after) - 1) // 10)] for i in range(11)]
print("  rank 0 RSS curve (MiB):", " ".join(f"{x['step']}:{x['rss_bytes'] / 2**20:.1f}" for x in pts))
print("  verdict:", "flat (no growth beyond 1% after warm-up)" if ok else "GROWS")
PY
