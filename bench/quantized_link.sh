#!/usr/bin/env bash
# bench_quantized across a slow link (issue 38): two "hosts" (scripts/netns_hosts.sh, two
# network namespaces joined by a veth) with RPH ranks each, the link shaped on both ends by tc
# (`netem rate RATE delay DELAY limit 10000`, or `tbf rate RATE burst 256kb latency 200ms`
# where the kernel has no netem), as bench/collectives_link.sh. fp32 all-gather and
# reduce-scatter against the int8 / int4 quantised ones (time, bytes each rank sends).
#
#   bench/quantized_link.sh [BUILD_DIR]
#   env: RATE (100mbit), DELAY (10ms), RPH (1), MIN (16384), MAX (1048576) floats per rank,
#        ITERS (3), BLOCK (256)
# Output: bench_quantized's table (read in bench/results/quantized_2026-11-29.md).
case "${1:-}" in
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench=$(cd "$build/bench" && pwd)/bench_quantized
source bench/link_common.sh
link_init quantized_link swql
rate=${RATE:-100mbit} delay=${DELAY:-10ms} rph=${RPH:-1}
link_up quantized_link "$prefix" "$rate" 256kb delay "$delay" limit 10000
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# link: $qdisc on both ends of $prefix-v; $rph ranks per host"
link_across "$A" "${BTL:-tcp,self}" "$rph" OMP_NUM_THREADS OMPI_MCA_mpi_yield_when_idle
"${across[@]}" "$bench" "${MIN:-16384}" "${MAX:-1048576}" "${ITERS:-3}" "${BLOCK:-256}"
