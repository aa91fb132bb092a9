#!/usr/bin/env bash
# Installs everything Shardwise needs from Debian's packages. Idempotent: a second run
# finds everything present and installs nothing.
set -euo pipefail
pkgs=(build-essential cmake ninja-build ccache pkg-config
      libopenmpi-dev openmpi-bin libopenblas-dev libopenblas0-openmp
      nlohmann-json3-dev catch2 libdnnl-dev libcli11-dev
      python3 python3-numpy python3-torch
      liburing-dev fio
      libpcre2-dev libsentencepiece-dev libicu-dev python3-venv  # tokenizers; the ref. venv
      clang libclang-rt-14-dev libomp-dev  # scripts/fuzz.sh: libFuzzer, clang's OpenMP
      doxygen  # scripts/gen_api_docs.sh: the C++ API reference
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
# The reference venv (.venv, git-ignored): Hugging Face's transformers, tokenizers and
# sentencepiece from PyPI, on Debian's torch and numpy (--system-site-packages), pinned so the
# reference tests compare against the same code everywhere. Installed once; nothing downloads
# at build or test time.
ref_pkgs=(transformers==4.46.3 tokenizers==0.20.3 sentencepiece==0.2.0)
if ! .venv/bin/python -c "import transformers, tokenizers, sentencepiece" 2>/dev/null; then
  echo "setup: creating .venv with ${ref_pkgs[*]}"
  /usr/bin/python3 -m venv --system-site-packages .venv
  .venv/bin/pip install -q --disable-pip-version-check "${ref_pkgs[@]}"
else
  echo "setup: .venv present"
fi
