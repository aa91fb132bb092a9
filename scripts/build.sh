#!/usr/bin/env bash
# Configures and builds Shardwise into ${BUILD_DIR:-build} (Release, ccache, Ninja).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}"
