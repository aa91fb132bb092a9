#!/usr/bin/env bash
# Set up, build and run the whole test suite (ctest; labels unit, mpi, reference, slow).
# Extra arguments go to ctest, e.g. `bash scripts/test.sh -L unit` for the quick subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j "${CTEST_JOBS:-2}" --timeout 900 "$@"
