#!/usr/bin/env bash
# Puts cuDNN's frontend (NVIDIA's header-only C++ graph API over cuDNN, MIT licensed) in
# .deps/cudnn_frontend/include, where CMake looks for it (SW_CUDNN_FRONTEND_ROOT): with it the
# CUDA backend builds cuDNN's fused attention (kernels/cuda/attention_cudnn.cpp). Its headers
# come from PyPI's wheel nvidia-cudnn-frontend (pinned below; nothing else of the wheel is
# used, nothing is installed). Idempotent: a present copy of this version is kept.
# scripts/setup.sh calls it where nvcc is found; gpu_gather.sh copies the result into .gpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
dest=.deps/cudnn_frontend
have() {
  local h=$dest/include/cudnn_frontend_version.h
  [ -f "$h" ] && [ "$(sed -n 's/^#define CUDNN_FRONTEND_\(MAJOR\|MINOR\|PATCH\)_VERSION \([0-9]*\).*/\2/p' "$h" |
    paste -sd.)" = "$version" ]
}
if have; then echo "cudnn_frontend: $version present in $dest"; exit 0; fi
command -v python3 >/dev/null || { echo "cudnn_frontend: needs python3 with pip" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Any wheel of the version carries the same headers: ask for one built for CPython 3.11 on
# x86-64 Linux whatever this machine's Python is.
if ! python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$tmp" \
    "nvidia-cudnn-frontend==$version" >"$tmp/log" 2>&1; then
  cat "$tmp/log" >&2
  echo "cudnn_frontend: could not download nvidia-cudnn-frontend==$version from PyPI;" \
    "put a copy's include/ in $dest (or point SW_CUDNN_FRONTEND_ROOT at one)" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest"
python3 - "$tmp"/nvidia_cudnn_frontend-*.whl "$dest" <<'PY'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit(f"cudnn_frontend: {whl} has no include/cudnn_frontend.h")
    for n in names:
        z.extract(n, dest)
print(f"cudnn_frontend: {len(names)} headers into {dest}/include")
PY
have || { echo "cudnn_frontend: $dest does not hold version $version after unpacking" >&2; exit 1; }
