#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (-fsanitize=fuzzer,address,undefined) into
# ${FUZZ_BUILD_DIR:-build-fuzz} (the project's libraries they link, compiled there with those
# flags through ccache; nothing else) and runs each for SECONDS (default 60), one after the other,
# starting from fuzz/corpus/<target> (new inputs it finds go to
# ${FUZZ_BUILD_DIR}/corpus/<target>, so the repository's seeds stay small).
#   scripts/fuzz.sh [SECONDS] [TARGET...]      targets: safetensors ckpt_metadata config token_header
# A crash is written to fuzz/regressions/<target>/crash-<sha1> (libFuzzer's name): fix the
# bug, keep the file, and ctest's fuzz_replay_<target> (label unit) replays it from then on.
# Each target's last libFuzzer status line (#execs, cov, ft, corp) goes to
# ${FUZZ_BUILD_DIR}/logs/<target>.log and the summary to stdout. Exit 1 if any target crashed.
# FUZZ_ARGS: more libFuzzer flags (CI: -seed=1). JOBS: build jobs (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(safetensors ckpt_metadata config token_header)
build=${FUZZ_BUILD_DIR:-build-fuzz}
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (scripts/setup.sh installs it)"; exit 2; }

# ccache hits across clones (CI's clean clone) need paths relative to the checkout.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
# -gline-tables-only: a report's stack still names file and line; the build is 18% faster.
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
flags+=" -fno-omit-frame-pointer -gline-tables-only -O1"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DSW_FUZZ=ON -DSW_TESTS=OFF \
  -DSW_BENCH=OFF -DSW_CUDA=OFF >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"

mkdir -p "$build/logs"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t" "fuzz/regressions/$t"
  log="$build/logs/$t.log"
  echo "fuzz: $t for ${secs}s"
  # -rss_limit_mb / -malloc_limit_mb: an allocation sized from the input that believes a
  # huge claim is a finding ("malloc(N) exceeds limit").
  if "$build/fuzz/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -max_len=65536 -timeout=10 -print_final_stats=1 -artifact_prefix="fuzz/regressions/$t/" \
      ${FUZZ_ARGS:-} \
      "$build/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    :
  else
    echo "fuzz: $t FAILED: see $log and fuzz/regressions/$t/"
    status=1
  fi
  # The last status line and the final stats.
  grep -E '^#[0-9]+' "$log" | tail -1 || true
  grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "$log" | tr '\n' ' ' || true
  echo
done
exit $status
