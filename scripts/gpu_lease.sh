#!/usr/bin/env bash
# gpu_lease.sh: everything a short lease of a GPU machine should run, in one command that ends
# by itself: scripts/gpu_build.sh --test (facts, unpack, configure, build, the CUDA tests with
# their verbose error figures), then bench/gpu_vs_torch.sh in the order of what matters most
# (Shardwise beside torch.compile per model, then its per-op times, eager, the cuBLAS attention
# path)
# with the time that is left. Logs, the table and op_times_*.tsv go to gpu_build/ inside
# $OUT/gpu_lease.tgz (with gpu_vs_torch.txt and tests.txt beside it).
#
#   bash scripts/gpu_lease.sh [SECONDS]     (default 540: the device tool's 600 s per command,
#                                            less a margin; carry [".gpu"])
#   GPU_LEASE_ORDER=... overrides the benchmark's --order (MODEL:ENGINE,...).
# First H100 lease (2026-11-26): the build took 37-60 s, the CUDA tests about a minute, the
# 1.3B Llama's torch.compile 52 s before its first step, Shardwise's 1.3B run 63 s (most of it
# the parameters' initialisation, since run on all cores). H200 leases (2026-11-27): the
# build of the CUDA tests took ~100 s on a fresh machine, the tests ~60 s (cuDNN builds its
# graphs); the 1.3B Llama's Shardwise run 12 s, its torch.compile 53 s, GPT-2's 4 s and 25 s.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# The device tool returns at most 8 files from $OUT: the logs are written to a folder of their
# own and packed into $OUT/gpu_lease.tgz at exit (a timeout's TERM included), with the table
# and the test logs' summary beside it to read at once.
if [ -n "${OUT:-}" ]; then
  lease_out=$OUT
  OUT=$(mktemp -d /tmp/gpu_lease.XXXXXX)
  export OUT
  pack() {
    tar czf "$lease_out/gpu_lease.tgz" -C "$OUT" . 2>/dev/null
    cp "$OUT/gpu_build/gpu_vs_torch.txt" "$lease_out/" 2>/dev/null
    grep -hE 'tests passed|Test +#|\*\*\*' "$OUT"/gpu_build/cuda*.log >"$lease_out/tests.txt" 2>/dev/null
    # The backend's one-line notices (a cuBLASLt epilogue refused, an NCCL watchdog abort),
    # counted per distinct line, from every log: what took a slower path without failing.
    grep -rhoE 'shardwise( cuda)?: .*(refused|watchdog).*' "$OUT" 2>/dev/null |
      sort | uniq -c | sort -rn | head -50 >"$lease_out/notices.txt"
    rm -rf "$OUT"
  }
  trap pack EXIT
  trap 'exit 143' TERM INT
fi
total=${1:-540}
deadline=$((SECONDS + total))
export CTEST_TIMEOUT=${CTEST_TIMEOUT:-120}
# The build and tests get half the time, at least 200 s (a 265 s lease gave them half, and the
# tests were cut off in cuda_ops), leaving the benchmark 60 s or more; a hang (each gated test
# has a 60 s watchdog, each test a ctest timeout) cannot take the benchmark's share.
test_cap=$((total / 2 > 200 ? total / 2 : 200))
((test_cap > total - 60)) && test_cap=$((total - 60))
timeout -k 5 "$test_cap" bash scripts/gpu_build.sh --test
echo "gpu_lease: tests exit $?"
left=$((deadline - SECONDS - 15))
# Shardwise (cuDNN's attention, the default) against compile on the same machine first (the
# 2026-11-27 lease had to divide by another call's compile figure), then where the steps go
# (op times; the Llama's profile, whose trace has the device's times), then the rest.
order=${GPU_LEASE_ORDER:-llama:shardwise,llama:compile,gpt2:shardwise,gpt2:compile,llama:shardwise_optimes,gpt2:shardwise_optimes,llama:shardwise_profile,llama:eager,gpt2:eager,llama:shardwise_cublas,gpt2:shardwise_cublas}
if ((left < 60)); then
  echo "gpu_lease: ${left}s left, no time for the benchmark"
  exit 1
fi
BENCH_ARGS="--budget $((left - 25)) --order $order" timeout -k 5 "$left" bash scripts/gpu_build.sh --bench
rc=$?
# This card's compute as a planner profile (bench/gpu_profile.py), where the GEMM bench and the
# Llama's op-timed run (5 steps) both ran: gpu_build/hardware_measured.json.
g=${OUT:+$OUT/gpu_build}
g=${g:-build-gpu/logs}  # (gpu_build.sh's logs without $OUT)
if [ -f "$g/bench_cuda_gemm.log" ] && [ -f "$g/op_times_llama.tsv" ]; then
  python3 bench/gpu_profile.py --gemm "$g/bench_cuda_gemm.log" --op-times "$g/op_times_llama.tsv" \
    --steps 5 --facts "$g/facts.log" --out "$g/hardware_measured.json"
fi
exit $rc
