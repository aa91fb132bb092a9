#!/usr/bin/env bash
# Installs everything Shardwise needs from Debian's packages. Idempotent: a second run
# finds everything present and installs nothing.
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache pkg-config
      libopenmpi-dev openmpi-bin libopenblas-dev libopenblas0-openmp
      nlohmann-json3-dev catch2 libdnnl-dev libcli11-dev
      python3 python3-numpy python3-torch
      liburing-dev fio
      clang libclang-rt-14-dev libomp-dev  # scripts/fuzz.sh: libFuzzer, clang's OpenMP
      fortunes fortunes-min)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
# cuDNN's frontend headers for the CUDA backend's cuDNN attention, where CUDA is built.
if command -v nvcc >/dev/null; then bash scripts/cudnn_frontend.sh; fi
