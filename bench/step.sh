#!/usr/bin/env bash
# Step throughput, Shardwise vs PyTorch on the same shapes, in the same run, alternating the
# runs (A B A B) so that machine noise hits both alike. Prints each run and the ratios.
#
#   bench/step.sh [BUILD_DIR] [-- extra bench_step args]   (default: GPT-2 124M, T=256, B=4)
#
# MODE (environment) picks the comparison:
#   single (default)  Shardwise 1 rank x THREADS vs PyTorch 1 process x THREADS
#   mpi               Shardwise unsharded 1 rank x 2 threads, Shardwise STRATEGY (FULL_SHARD)
#                     on 2 ranks x 1 thread (mpirun), PyTorch DDP 2 ranks x 1 thread (gloo);
#                     B is per rank, so the sharded runs process twice the tokens per step
#   bf16              Shardwise fp32, Shardwise bf16 compute (--compute bf16) and PyTorch bf16
#                     autocast, 1 process x THREADS each, alternating; ratios bf16/fp32 and
#                     bf16/PyTorch-bf16 (issue 4 targets: >= 1.6x and >= 1.3x)
#   peers             Shardwise, the tuned PyTorch (--tuned) and the plain one per round, in
#                     TORCH_DTYPE (bf16: Shardwise --compute bf16); per-round ratios, means,
#                     medians (issue 39 point 5: bf16, d 384, 6 layers, vocab 8192, B 8)
#   pool              no runs: `MODE=pool bench/step.sh LOG...` pools the rounds of peers runs'
#                     saved output (their "round N: shardwise ..." lines) into one table, the
#                     interval resampled over all of them
#   memory            per-rank memory of STRATEGY at world 1, 2 and 4 (MEM_ARGS: the shape for
#                     all three, default a 6-layer d=512 GPT-2 so that 4 ranks fit beside the
#                     other jobs on this machine); model state should fall as 1/N
# Environment: THREADS (2), ROUNDS (2), STEPS (5), TORCH_DTYPE (fp32), STRATEGY (FULL_SHARD),
# TORCH_PY (the python with PyTorch: /usr/bin/python3, Debian's 1.13), TORCH_ARGS (more
# torch_step.py flags, e.g. --tuned: torch.compile with the loss inside, fused AdamW;
# needs torch >= 2.4, e.g. from PyPI in a venv).
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
set -euo pipefail
logs=("$@")
build=${1:-build}
shift || true
[ "${1:-}" = "--" ] && shift
mode=${MODE:-single}
threads=${THREADS:-2} rounds=${ROUNDS:-2} steps=${STEPS:-5} strategy=${STRATEGY:-FULL_SHARD}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
tpy=${TORCH_PY:-$py}
read -r -a torch_extra <<<"${TORCH_ARGS:-}"
mpirun=(mpirun --allow-run-as-root --oversubscribe)
export OMPI_MCA_mpi_yield_when_idle=1
# bench_step's shape flags map one-to-one onto the PyTorch scripts'.
shape=()
for ((i = 1; i <= $#; i++)); do
  case ${!i} in
    --d|--layers|--heads|--vocab|--T|--B) j=$((i + 1)); shape+=("${!i}" "${!j}") ;;
  esac
done
# Debian's OpenBLAS 0.3.21 does not recognise this CPU and falls back to its SSE3 (Prescott)
# kernels, ~6x slower; Shardwise re-selects the right kernels at start-up (kernels/cpu/gemm.cpp).
# PyTorch gets the same fix through OPENBLAS_CORETYPE, so both peers run their best GEMMs.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -qw avx512f /proc/cpuinfo; then torch_core=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then torch_core=Haswell
  else torch_core=""; fi
else
  torch_core=$OPENBLAS_CORETYPE
fi
torch_env=(env OMP_WAIT_POLICY=PASSIVE ${torch_core:+OPENBLAS_CORETYPE=$torch_core})
tps() { "$py" -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "${1:-tokens_per_s}"; }
# tps for a peer that may not run here (torch_step.py's status "unavailable": a torch without
# compile or SDPA): nan, and its reason on stderr.
tps_or_nan() {
  "$py" -c '
import json, sys
lines = sys.stdin.read().strip().splitlines()
r = json.loads(lines[-1]) if lines else {"error": "no output"}
if "tokens_per_s" in r:
    print(r["tokens_per_s"])
else:
    print("nan")
    print("step.sh: " + r.get("mode", "peer") + " peer: " + r.get("error", r.get("status", "?")), file=sys.stderr)'
}
# rounds_table LABELS RATIOS COL...: one row per round of the columns (each COL the rounds'
# tokens/s, space-separated; LABELS "a|b|c" names them) and the ratios RATIOS names
# ("i/j:label ..."), then the best, mean and median rows (ratios of those figures) and the
# per-round ratios' median and range, and a 90% interval of the ratio of the means.
rounds_table() {
  "$py" - "$@" <<'PY'
import random
import statistics as st
import sys
labels = sys.argv[1].split("|")
ratios = [(int(p.split(":")[0].split("/")[0]), int(p.split(":")[0].split("/")[1]), p.split(":", 1)[1])
          for p in sys.argv[2].split()]
cols = [[float(x) for x in a.split()] for a in sys.argv[3:]]
w = [max(11, len(l)) for l in labels]
rw = [max(6, len(r[2])) for r in ratios]
print("round  " + "  ".join(f"{l:>{n}}" for l, n in zip(labels, w)) + "  " +
      "  ".join(f"{r[2]:>{n}}" for r, n in zip(ratios, rw)))
def row(name, v):
    print(f"{name:6s} " + "  ".join(f"{x:{n}.1f}" for x, n in zip(v, w)) + "  " +
          "  ".join(f"{v[a] / v[b]:{n - 1}.2f}x" for (a, b, _), n in zip(ratios, rw)))
for i in range(len(cols[0])):
    row(f"{i + 1:5d}", [c[i] for c in cols])
for name, f in (("best", max), ("mean", st.mean), ("median", st.median)):
    row(name, [f(c) for c in cols])
# The ratio of the means with a 90% interval from resampling whole rounds (each round's figures
# stay together: they ran back to back, in the same spell of a shared machine), fixed seed.
rng = random.Random(1)
n = len(cols[0])
picks = [[rng.randrange(n) for _ in range(n)] for _ in range(4000)] if n > 1 else []
for a, b, name in ratios:
    r = [x / y for x, y in zip(cols[a], cols[b])]
    line = f"per-round {name}: median {st.median(r):.2f}x, range {min(r):.2f}-{max(r):.2f}x"
    if picks:
        boot = sorted(sum(cols[a][i] for i in p) / sum(cols[b][i] for i in p) for p in picks)
        lo, hi = boot[len(boot) // 20], boot[-len(boot) // 20 - 1]
        line += f"; mean ratio 90% interval {lo:.2f}-{hi:.2f}x"
    print(line)
PY
}

# The peers table over the rounds in sw, tu, pl (MODE=peers runs them; MODE=pool reads their
# "round N: shardwise S  tuned T  plain P" lines back from saved output).
peers_table() {
  rounds_table "shardwise tok/s|tuned tok/s|plain tok/s" "0/1:/tuned 0/2:/plain" \
    "${sw[*]}" "${tu[*]}" "${pl[*]}"
}

if [ "$mode" = single ]; then
  args=(--threads "$threads" --steps "$steps" "$@")
  torch_args=(--threads "$threads" --steps "$steps" --dtype "${TORCH_DTYPE:-fp32}" "${shape[@]}")
  sw=() pt=()
  for ((r = 1; r <= rounds; r++)); do
    line=$("$build/bench/bench_step" "${args[@]}" | tee -a /dev/stderr | tail -1)
    sw+=("$(echo "$line" | tps)")
    line=$("${torch_env[@]}" "$tpy" "$here/torch_step.py" "${torch_args[@]}" "${torch_extra[@]}")
    echo "$line" >&2
    pt+=("$(echo "$line" | tps)")
  done
  "$py" - "${sw[*]}" "${pt[*]}" <<'PY'
import sys
sw = [float(x) for x in sys.argv[1].split()]
pt = [float(x) for x in sys.argv[2].split()]
print("round  shardwise tok/s  pytorch tok/s  ratio")
for i, (a, b) in enumerate(zip(sw, pt), 1):
    print(f"{i:5d}  {a:15.1f}  {b:13.1f}  {a / b:5.2f}x")
print(f"best   {max(sw):15.1f}  {max(pt):13.1f}  {max(sw) / max(pt):5.2f}x  (target >= 1.2x)")
PY
elif [ "$mode" = mpi ]; then
  un=() fs=() dp=() ex=() cm=()
  for ((r = 1; r <= rounds; r++)); do
    line=$("$build/bench/bench_step" --threads 2 --steps "$steps" "$@" | tee -a /dev/stderr | tail -1)
    un+=("$(echo "$line" | tps)")
    line=$("${mpirun[@]}" -np 2 "$build/bench/bench_step" --threads 1 --steps "$steps" \
             --strategy "$strategy" "$@" | tee -a /dev/stderr | tail -1)
    fs+=("$(echo "$line" | tps)")
    ex+=("$(echo "$line" | tps exposed_comm_s)")
    cm+=("$(echo "$line" | tps comm_s)")
    line=$("${torch_env[@]}" "$py" "$here/torch_ddp.py" --ranks 2 --threads 1 \
             --steps "$steps" "${shape[@]}")
    echo "$line" >&2
    dp+=("$(echo "$line" | tps)")
  done
  "$py" - "$strategy" "${un[*]}" "${fs[*]}" "${dp[*]}" "${ex[*]}" "${cm[*]}" <<'PY'
import sys
name = sys.argv[1]
un, fs, dp, ex, cm = ([float(x) for x in a.split()] for a in sys.argv[2:7])
print(f"round  unsharded 1x2 tok/s  {name} 2x1 tok/s  DDP 2x1 tok/s  {name}/unsharded"
      f"  {name}/DDP  comm s/step  exposed s/step")
for i in range(len(un)):
    print(f"{i + 1:5d}  {un[i]:20.1f}  {fs[i]:{len(name) + 10}.1f}  {dp[i]:13.1f}"
          f"  {fs[i] / un[i]:{len(name) + 10}.2f}x  {fs[i] / dp[i]:{len(name) + 3}.2f}x"
          f"  {cm[i]:11.3f}  {ex[i]:14.3f}")
print(f"best   {max(un):20.1f}  {max(fs):{len(name) + 10}.1f}  {max(dp):13.1f}"
      f"  {max(fs) / max(un):{len(name) + 10}.2f}x  {max(fs) / max(dp):{len(name) + 3}.2f}x"
      f"  (targets >= 0.90x, >= 1.2x)")
PY
elif [ "$mode" = bf16 ]; then
  args=(--threads "$threads" --steps "$steps" "$@")
  f32=() b16=() pt=()
  for ((r = 1; r <= rounds; r++)); do
    line=$("$build/bench/bench_step" "${args[@]}" --compute f32 | tee -a /dev/stderr | tail -1)
    f32+=("$(echo "$line" | tps)")
    line=$("$build/bench/bench_step" "${args[@]}" --compute bf16 | tee -a /dev/stderr | tail -1)
    b16+=("$(echo "$line" | tps)")
    line=$("${torch_env[@]}" "$tpy" "$here/torch_step.py" --threads "$threads" --steps "$steps" \
             --dtype bf16 "${shape[@]}" "${torch_extra[@]}")
    echo "$line" >&2
    pt+=("$(echo "$line" | tps)")
  done
  rounds_table "shardwise fp32 tok/s|shardwise bf16 tok/s|pytorch bf16 tok/s" \
    "1/0:bf16/fp32 1/2:bf16/pt-bf16" "${f32[*]}" "${b16[*]}" "${pt[*]}"
  echo "(issue 4 targets: bf16/fp32 >= 1.6x, bf16/pt-bf16 >= 1.3x)"
elif [ "$mode" = peers ]; then
  # Per round: Shardwise, the tuned PyTorch (torch_step.py --tuned) and the plain one, each
  # 1 process x THREADS, in TORCH_DTYPE (bench_step --compute bf16 for bf16), so that a slow
  # spell of the machine falls on all three of a round alike.
  dt=${TORCH_DTYPE:-fp32}
  compute=f32
  [ "$dt" = bf16 ] && compute=bf16
  args=(--threads "$threads" --steps "$steps" --compute "$compute" "$@")
  targs=(--threads "$threads" --steps "$steps" --dtype "$dt" "${shape[@]}" "${torch_extra[@]}")
  sw=() tu=() pl=()
  for ((r = 1; r <= rounds; r++)); do
    line=$("$build/bench/bench_step" "${args[@]}" | tail -1)
    sw+=("$(echo "$line" | tps)")
    line=$("${torch_env[@]}" "$tpy" "$here/torch_step.py" "${targs[@]}" --tuned 2>/dev/null | tail -1)
    tu+=("$(echo "$line" | tps_or_nan)")
    line=$("${torch_env[@]}" "$tpy" "$here/torch_step.py" "${targs[@]}" 2>/dev/null | tail -1)
    pl+=("$(echo "$line" | tps_or_nan)")
    echo "round $r: shardwise ${sw[-1]}  tuned ${tu[-1]}  plain ${pl[-1]}" >&2
  done
  peers_table
elif [ "$mode" = pool ]; then
  ((${#logs[@]})) || { echo "step.sh: MODE=pool needs the peers runs' logs" >&2; exit 2; }
  sw=() tu=() pl=()
  for f in "${logs[@]}"; do
    [ -r "$f" ] || { echo "step.sh: $f: cannot read" >&2; exit 2; }
    while read -r _ _ _ s _ t _ p; do
      sw+=("$s") tu+=("$t") pl+=("$p")
    done < <(grep -E '^round [0-9]+: shardwise ' "$f")
  done
  ((${#sw[@]})) || { echo "step.sh: no 'round N: shardwise' lines in ${logs[*]}" >&2; exit 2; }
  echo "pooled: ${#sw[@]} rounds from ${#logs[@]} run(s)"
  peers_table
elif [ "$mode" = memory ]; then
  read -r -a mem_args <<<"${MEM_ARGS:---d 512 --layers 6 --heads 8 --T 128 --B 2}"
  for np in 1 2 4; do
    echo "== world $np ($strategy)"
    if [ "$np" = 1 ]; then
      "$build/bench/bench_step" --threads 1 --steps 2 --warmup 1 "${mem_args[@]}" "$@" | grep -E "^(model|ranks|rank|step)"
    else
      "${mpirun[@]}" -np "$np" "$build/bench/bench_step" --threads 1 --steps 2 --warmup 1 \
        --strategy "$strategy" "${mem_args[@]}" "$@" | grep -E "^(model|ranks|rank|step)"
    fi
  done
else
  echo "step.sh: unknown MODE '$mode' (single, mpi, bf16, peers, pool or memory)" >&2
  exit 2
fi
