#!/usr/bin/env bash
# The async I/O engine (offload/aio.h) against fio on DIR's disk: sequential write and read,
# same block size, queue depth, engine kind and O_DIRECT, alternating order, AIO_REPS
# repetitions (7); prints each, the medians and their ratios (target: engine >= 0.90 x fio).
# Run it when the machine is quiet (uptime): the figures are only as steady as the disk.
#   bench/aio_vs_fio.sh DIR
# Environment (see bench/bench_aio.cpp): AIO_BENCH_BYTES (2GiB), AIO_BLOCK (1MiB), AIO_QD (8),
# AIO_BACKEND (auto|io_uring|threads), AIO_THREADS (1), AIO_DIRECT (1), AIO_CHUNK (64MiB), AIO_INFLIGHT (2).
# BUILD_DIR (build) holds bench/bench_aio. Needs fio (scripts/setup.sh installs it).
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
set -euo pipefail
dir=${1:?usage: bench/aio_vs_fio.sh DIR}
cd "$(dirname "$0")/.."
bin=${BUILD_DIR:-build}/bench/bench_aio
command -v fio >/dev/null || { echo "aio_vs_fio: fio not found: run scripts/setup.sh" >&2; exit 1; }
[ -x "$bin" ] || { echo "aio_vs_fio: $bin not built (scripts/build.sh)" >&2; exit 1; }
mkdir -p "$dir"
free=$(df -B1 --output=avail "$dir" | tail -1)
size=$(echo "${AIO_BENCH_BYTES:-2GiB}" | sed 's/iB$/i/; s/B$//')
need=$(( 2 * $(numfmt --from=auto "$size") ))
if [ "$free" -lt "$need" ]; then
  echo "aio_vs_fio: $dir has $free bytes free, the benchmark needs $need" >&2; exit 1
fi
exec "$bin" "$dir"
