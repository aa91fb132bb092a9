#!/usr/bin/env bash
# Issue 10's overlap target for optimizer state on NVMe, timed through `shardwise train`: the
# GPT-2 124M shape (T=256, micro-batch 4, 1 rank x 2 threads) with AdamW's moments in memory vs
# in a file under DIR (offload_optimizer.device = nvme, on the aio-backed io queue),
# alternating, ROUNDS rounds per accumulation count in ACCUMS, with SHARDWISE_IO_UNCACHED=1 so
# every step reads the moments from the disk (as when they exceed the page cache). Each round
# measures the disk's own sequential bandwidth first (dd, O_DIRECT, 1 GiB) and prints the
# target: step <= 1.15 x max(in-memory step, moment bytes read and written / disk bandwidth).
#
#   bench/offload_step.sh DIR [BUILD_DIR]
#   env: ROUNDS (2), STEPS (6), ACCUMS ("1 8"; ACCUM=N alone is ACCUMS=N), AIO_BACKEND (auto)
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: bench/offload_step.sh DIR [BUILD_DIR]}
build=${2:-build}
sw=$build/tools/shardwise
rounds=${ROUNDS:-2} steps=${STEPS:-6} accums=${ACCUMS:-${ACCUM:-1 8}} backend=${AIO_BACKEND:-auto}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
work=$(mktemp -d /tmp/sw_offload_step.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dir"
source scripts/fortunes.sh
prepare_fortunes "$sw"
echo "offload_step: aio.backend $backend -> $(AIO_BACKEND=$backend "$build/bench/bench_aio" --backend)"
for accum in $accums; do
# The 124M shape (configs/gpt2_124m.json): STEPS steps of ACCUM micro-steps, 2 threads.
big=(configs/gpt2_124m.json --set train_steps="$steps" --set gradient_accumulation_steps="$accum"
     --set threads=2 --set data.val= --set aio.backend="$backend")
# AdamW's moments in bytes: the plan's persistent optimizer memory without offload.
moments=$("$sw" plan-dump "${big[@]}" | sed -n 's/.*persistent:.* optimizer \([0-9.]*\) MiB.*/\1/p')
for r in $(seq 1 "$rounds"); do
  dd if=/dev/zero of="$dir/dd.bin" bs=8M count=128 oflag=direct 2>"$work/w.txt"
  dd if="$dir/dd.bin" of=/dev/null bs=8M iflag=direct 2>"$work/r.txt"
  rm -f "$dir/dd.bin"
  mem_run() { "$sw" train "${big[@]}" --quiet --no-export --set run_dir="$work/mem" >/dev/null; }
  nvme_run() {
    SHARDWISE_IO_UNCACHED=1 "$sw" train "${big[@]}" --quiet --no-export \
      --set run_dir="$work/nvme" --set zero_optimization.offload_optimizer.device=nvme \
      --set zero_optimization.offload_optimizer.nvme_path="$dir" >/dev/null
  }
  # Alternate which goes first (a shared machine's load drifts).
  rm -rf "$work/mem" "$work/nvme"
  if [ $((r % 2)) -eq 1 ]; then mem_run; nvme_run; else nvme_run; mem_run; fi
  /usr/bin/python3 - "$work" "$r" "$moments" "$accum" <<'PY'
import json, re, statistics, sys
work, r, accum = sys.argv[1], sys.argv[2], sys.argv[4]
moments = float(sys.argv[3]) * 2**20  # AdamW m and v, fp32
def bw(f):  # dd's "N bytes ... copied, T s": bytes per second
    m = re.search(r"(\d+) bytes .* copied, ([0-9.]+) s", open(f).read())
    return int(m.group(1)) / float(m.group(2))
wbw, rbw = bw(work + "/w.txt"), bw(work + "/r.txt")
mem = [json.loads(l) for l in open(work + "/mem/metrics.jsonl")][2:]
nv = [json.loads(l) for l in open(work + "/nvme/metrics.jsonl")][2:]
sm = statistics.median(x["step_time_s"] for x in mem)
sn = statistics.median(x["step_time_s"] for x in nv)
io = moments / rbw + moments / wbw
limit = max(sm, io)
print(f"accum {accum} round {r}: in-memory {sm:.2f} s, NVMe {sn:.2f} s ({sn / sm:.2f}x); disk read "
      f"{rbw / 1e9:.2f} GB/s, write {wbw / 1e9:.2f} GB/s, moments I/O {io:.2f} s/step; "
      f"NVMe step / max(in-memory, I/O) = {sn / limit:.2f} (target <= 1.15); "
      f"losses equal: {[x['loss'] for x in mem] == [x['loss'] for x in nv]}")
PY
done
done
