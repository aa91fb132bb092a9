#!/usr/bin/env bash
# bench_collectives across a slow link (issue 38): two "hosts" (scripts/netns_hosts.sh, two
# network namespaces on this machine joined by a veth) with RPH ranks each (mpirun maps them by
# slot, so each host holds consecutive ranks and OMPI_COMM_WORLD_LOCAL_SIZE = RPH: the layout
# CommAlgo::Hierarchical uses), the link shaped on both ends by tc (`netem rate RATE delay
# DELAY limit 10000`, or `tbf rate RATE burst 256kb latency 200ms` where the kernel has no
# netem). Every message goes over TCP (BTL, default tcp,self: inside a host over the namespace's
# loopback, across over the veth; OpenMPI 4.1's vader segfaults in MPI_Comm_dup here, as both
# namespaces have one hostname).
# Every algorithm against OpenMPI's own, all_gather, reduce_scatter and all_reduce, sizes MIN
# to MAX (x4); minimum of ITERS iterations (the machine is shared). The namespaces are removed
# on exit (also on error or Ctrl-C).
#
#   bench/collectives_link.sh [BUILD_DIR]
#   env: RATE (100mbit), DELAY (10ms), RPH (2), MIN (8), MAX (4M), ITERS (3), BTL (tcp,self),
#        ALGOS (mpi,ring,direct,oneshot,tree,halving_doubling,hierarchical,auto)
# Output: bench_collectives' tables on stdout (read in bench/results/collectives_2026-11-29.md).
case "${1:-}" in
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bench=$(cd "$build/bench" && pwd)/bench_collectives
source bench/link_common.sh
link_init collectives_link swcl
rate=${RATE:-100mbit} delay=${DELAY:-10ms} rph=${RPH:-2}
link_up collectives_link "$prefix" "$rate" 256kb delay "$delay" limit 10000
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# link: $qdisc on both ends of $prefix-v; $rph ranks per host"
link_across "$A" "${BTL:-tcp,self}" "$rph" OMP_NUM_THREADS OMPI_MCA_mpi_yield_when_idle
"${across[@]}" "$bench" --min "${MIN:-8}" --max "${MAX:-4M}" --step 4 --iters "${ITERS:-3}" --warmup 1 --stat min \
  --algos "${ALGOS:-mpi,ring,direct,oneshot,tree,halving_doubling,hierarchical,auto}"
