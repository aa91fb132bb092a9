#!/usr/bin/env bash
# gpu_simulate.sh [gpu_build.sh arguments | --run COMMAND]: runs scripts/gpu_build.sh (or, with
# --run, a shell command, after sourcing the prefix's env.sh if there is one) on this Debian machine the
# way a bare GPU machine would see it, to check the two gpu_ scripts where there is no such
# machine. Inside a private mount namespace (root, unshare), so nothing outside it changes:
#  - every file of the packages in .gpu/manifest.tsv that are installed here, and of OpenBLAS's
#    pthread build, is hidden under /dev/null (zlib1g, libudev1 and libuuid1 stay: this
#    machine's own tools load them), so the build can only use the unpacked prefix;
#  - NCCL and cuDNN leave the CUDA toolkit's folders for the layout of PyTorch's pip wheels:
#    site-packages/nvidia/{nccl,cudnn}/{lib,include} on PYTHONPATH, the versioned libraries only.
# The build directory defaults to build-gpu-sim (its cache names the namespace's paths).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] && command -v unshare >/dev/null ||
  { echo "gpu_simulate: needs root and unshare" >&2; exit 2; }
[ -f .gpu/manifest.tsv ] || { echo "gpu_simulate: run scripts/gpu_gather.sh first" >&2; exit 2; }
if [ -z "${SW_SIM_INSIDE:-}" ]; then
  exec unshare --mount --propagation private env SW_SIM_INSIDE=1 bash "$0" "$@"
fi

keep=" zlib1g libudev1 libuuid1 "
n=0
for p in $(awk -F'\t' '!/^#/ {print $1}' .gpu/manifest.tsv) \
         libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0; do
  [[ $keep == *" $p "* ]] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || continue
  while IFS= read -r f; do
    if [ -f "$f" ] && [ ! -L "$f" ]; then
      mount --bind /dev/null "$f"
      n=$((n + 1))
    fi
  done < <(dpkg -L "$p")
done
echo "gpu_simulate: $n files of the system's packages hidden"

sim=/tmp/sw_gpu_simulate
mkdir -p "$sim"
mount -t tmpfs tmpfs "$sim"
cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
for d in lib include; do
  mkdir -p "$sim/orig-$d" "$sim/view-$d"
  mount --bind "$cuda/$d" "$sim/orig-$d"
  for f in "$sim/orig-$d"/*; do
    case ${f##*/} in *nccl* | *cudnn*) ;; *) ln -s "$f" "$sim/view-$d/" ;; esac
  done
  mount --bind "$sim/view-$d" "$cuda/$d"
done
for name in nccl cudnn; do
  mkdir -p "$sim/site/nvidia/$name/lib" "$sim/site/nvidia/$name/include"
  ln -s "$sim/orig-lib/lib$name"*.so.[0-9]* "$sim/site/nvidia/$name/lib/"
  ln -s "$sim/orig-include/$name"* "$sim/site/nvidia/$name/include/"
done
export PYTHONPATH=$sim/site${PYTHONPATH:+:$PYTHONPATH}
echo "gpu_simulate: NCCL and cuDNN only in $sim/site/nvidia (PYTHONPATH)"
export BUILD_DIR=${BUILD_DIR:-build-gpu-sim}
if [ "${1:-}" = --run ]; then
  env=${SW_PREFIX:-/tmp/swprefix}/env.sh
  # shellcheck disable=SC1090
  [ -f "$env" ] && . "$env"
  exec bash -c "$2"
fi
exec bash scripts/gpu_build.sh "$@"
