#!/usr/bin/env bash
# The default job: set up, build, prepare the fortunes corpus (Debian's `fortunes` package, so
# nothing is downloaded), train the default small GPT (configs/default.json) and print a sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
sw=build/tools/shardwise
source scripts/fortunes.sh
prepare_fortunes "$sw"
"$sw" train configs/default.json "$@"
echo
echo "---- sample (greedy would repeat itself; temperature 0.8, top-k 40) ----"
"$sw" sample --config configs/default.json --weights runs/default/model.safetensors \
  --prompt "Q: " --tokens 300 --temperature 0.8 --top-k 40 --seed 1
echo
