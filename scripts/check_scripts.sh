#!/usr/bin/env bash
# CI's check that the scripts README.md documents still run (issue 41), so none rots unseen:
#   - every scripts/ and bench/ path README.md names exists and parses (bash -n, Python's ast);
#   - every bench/*.sh answers --help (exit 0, its usage on stdout);
#   - scripts/gpu_gather.sh --dry-run resolves its package closure (Debian 12 with apt only);
#   - scripts/gpu_simulate.sh --run true sets up its simulated GPU machine, where this machine
#     allows (root, unshare, nvcc and a .gpu/manifest.tsv from a real gpu_gather.sh run);
#   - scripts/gen_api_docs.sh writes the C++ API reference without a Doxygen warning;
#   - scripts/fuzz.sh builds the four libFuzzer targets (clang; only their libraries, through
#     ccache) and runs each for FUZZ_SECONDS (default 10) from a fixed seed.
# Each step prints its wall time; a skipped step prints one line saying why. Exit 1 if any
# step failed.
#   scripts/check_scripts.sh [--no-fuzz]
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
  --no-fuzz | "") ;;
  *) echo "check_scripts: unknown argument '$1'" >&2; exit 2 ;;
esac
failed=()
step() {  # step NAME COMMAND...: runs it, output to build-checks/NAME.log, prints the time
  local name=$1 t0=$SECONDS
  shift
  mkdir -p build-checks
  if "$@" >"build-checks/$name.log" 2>&1; then
    echo "check_scripts: $name ok ($((SECONDS - t0)) s)"
  else
    echo "check_scripts: $name FAILED ($((SECONDS - t0)) s); its output:"
    tail -40 "build-checks/$name.log" | sed 's/^/  | /'
    failed+=("$name")
  fi
}

readme_paths() {
  # (not build/bench/...: binaries the build makes)
  grep -oP '(?<![\w./-])(scripts|bench)/[\w./-]*' README.md | sed 's/[.,:;]*$//' | sort -u
}
parse_all() {
  local p rc=0
  for p in $(readme_paths); do
    if [ ! -e "$p" ]; then echo "README.md names $p, which does not exist"; rc=1; continue; fi
    case $p in
      *.sh) bash -n "$p" || rc=1 ;;
      *.py) python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])' "$p" || rc=1 ;;
    esac
    echo "$p"
  done
  return $rc
}
step readme_paths parse_all

bench_help() {
  local f rc=0
  for f in bench/*.sh; do
    if out=$(bash "$f" --help </dev/null 2>&1) && [ -n "$out" ]; then
      echo "$f --help: $(wc -l <<<"$out") lines"
    else
      echo "$f --help: exit $? or no output"
      rc=1
    fi
  done
  return $rc
}
step bench_help bench_help

if [ "$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")" = bookworm ] &&
    command -v apt-cache >/dev/null; then
  step gpu_gather_dry_run bash scripts/gpu_gather.sh --dry-run
else
  echo "check_scripts: gpu_gather.sh --dry-run skipped: not a Debian 12 (bookworm) machine with apt"
fi

why=""
[ "$(id -u)" = 0 ] || why="not root"
command -v unshare >/dev/null || why="${why:+$why, }no unshare"
command -v nvcc >/dev/null || why="${why:+$why, }no nvcc (CUDA toolkit)"
[ -f .gpu/manifest.tsv ] || why="${why:+$why, }no .gpu/manifest.tsv (a real scripts/gpu_gather.sh run downloads the packages; CI runs only its dry run)"
if [ -z "$why" ]; then
  step gpu_simulate bash scripts/gpu_simulate.sh --run true
else
  echo "check_scripts: gpu_simulate.sh skipped: $why"
fi

# The C++ API reference (issue 40): Doxygen over include/shardwise, any warning an error (about
# a second). Its output goes to build-checks/, not docs/api. scripts/package_check.sh (the .deb
# installed with dpkg, as root) is not run here: tests/api's api_install_external checks the
# same package from a temporary prefix in the test suite.
if command -v doxygen >/dev/null; then
  step gen_api_docs bash scripts/gen_api_docs.sh build-checks/api
else
  echo "check_scripts: gen_api_docs.sh FAILED: no doxygen (scripts/setup.sh installs it)"
  failed+=(gen_api_docs)
fi

if [ "${1:-}" = --no-fuzz ]; then
  echo "check_scripts: fuzz.sh skipped: --no-fuzz"
elif ! command -v clang++ >/dev/null; then
  echo "check_scripts: fuzz.sh FAILED: no clang++ (scripts/setup.sh installs it)"
  failed+=(fuzz)
else
  # A fixed seed: the same inputs each run, so a CI failure is a finding to replay, not luck.
  step fuzz env FUZZ_ARGS="${FUZZ_ARGS:--seed=1}" bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
  grep -E '^(fuzz:|#[0-9]+)' build-checks/fuzz.log | sed 's/^/  /'
fi

if ((${#failed[@]})); then
  echo "check_scripts: failed: ${failed[*]}"
  exit 1
fi
echo "check_scripts: every documented script runs"
