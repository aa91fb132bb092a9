#!/bin/bash
# `shardwise plan --json`'s device peak (tiers.device.peak_bytes: the plan's peak and the
# kernel workspace the CPU backend declares) against the tracked peak a run of the config
# reaches (metrics.jsonl's peak_mem_bytes over its steps), on small GPT-2 and Llama configs in
# fp32, bf16 (bf16n: on the native kernels, not oneDNN; bf16t: per-shape choice), fp16 and fp8
# (bf16 with fp8 linears, the current recipe; fp8ag: with the fp8 all-gather), at 1 or 2 OpenMP
# threads: within max(8 KiB, 0.2%). Small models are where kernel scratch the plan misses shows (before it was
# declared: the CPU attention's per-thread tiles, its norm partials and RoPE table, the step's
# loss sums, 2-5% of these; the fp8 linears' quantised copies; the own bf16 kernels' packed
# operands, whose blocks' forward and input-gradient products run from 1024 tokens on: the *_1k
# cases; the native and fused kernels' packed operands: the fp16, bf16n and bf16t cases).
# Prints the table. The 2-rank set runs under mpirun (label mpi).
# Usage: plan_vs_measured.sh SHARDWISE RANKS MPIEXEC [mpirun flags...]
set -u
ranks=$2
source "$(dirname "${BASH_SOURCE[0]}")/../engine/mpi_common.sh" plan_vs_measured "$1" "${@:3}"
prepare_text 2000

# name type d_model layers heads kv_heads vocab T micro_batch precision threads stage
if [ "$ranks" = 1 ]; then
  cases="gpt2_f32     gpt2  64  2 4 0 256  64  1 f32  2 3
         llama_gqa    llama 128 2 4 2 1024 128 8 f32  1 3
         gpt2_bf16    gpt2  256 4 8 0 2048 256 2 bf16 1 3
         llama_bf16   llama 64  2 4 4 256  256 1 bf16 2 3
         llama_fp16   llama 128 3 4 2 512  64  4 fp16 1 3
         gpt2_fp16    gpt2  96  2 4 0 2048 64  4 fp16 2 3
         gpt2_bf16n   gpt2  96  2 4 0 512  128 4 bf16n 2 3
         gpt2_bf16t   gpt2  96  2 4 0 512  128 4 bf16t 2 3
         gpt2_fp8     gpt2  128 2 4 0 512  128 4 fp8  2 3
         llama_fp8    llama 128 3 4 2 512  64  4 fp8  1 3
         gpt2_bf16_1k gpt2  96  2 4 0 256  256 4 bf16 2 3
         llama_fp8_1k llama 64  2 4 2 256  128 8 fp8  2 3"
else
  cases="gpt2_f32_2   gpt2  128 2 4 0 512  128 4 f32  1 3
         llama_bf16_2 llama 256 4 8 4 2048 64  4 bf16 1 3
         gpt2_bf16_z2 gpt2  192 3 6 0 1024 128 2 bf16 1 2
         gpt2_fp16_2  gpt2  128 2 4 0 512  128 2 fp16 1 3
         gpt2_fp8_2   gpt2  128 2 4 0 512  128 2 fp8  1 3
         llama_fp8_2  llama 128 2 4 2 512  64  4 fp8  1 2
         gpt2_fp8ag_2 gpt2  128 2 4 0 512  128 2 fp8ag 1 3"
fi
printf "%-13s %6s %12s %12s %12s %12s %9s\n" config ranks plan_peak kernel_ws planned measured diff
bad=0
while read -r name type d layers heads kv vocab T mb prec threads stage; do
  [ -n "$name" ] || continue
  kvkey=""
  [ "$type" = llama ] && kvkey=", \"n_kv_head\": $kv"
  mp=""
  [ "$prec" = bf16 ] && mp=', "bf16": {"enabled": true}'
  # bf16n: bf16 on our native kernels (gemm_bf16_avx512.cpp) instead of oneDNN, where the CPU
  # has AVX512-BF16 (fp16 takes the fused kernels of the same file wherever AVX-512 is); bf16t:
  # each product shape timed on the own kernel and oneDNN (both paths' scratch).
  lowp=()
  if [ "$prec" = bf16n ]; then
    grep -qw avx512_bf16 /proc/cpuinfo || { echo "$name: skipped (no AVX512-BF16)"; continue; }
    mp=', "bf16": {"enabled": true}' lowp=(SHARDWISE_LOWP_PATH=native)
  fi
  [ "$prec" = bf16t ] && mp=', "bf16": {"enabled": true}' lowp=(SHARDWISE_LOWP_PATH=tuned)
  [ "$prec" = fp16 ] && mp=', "fp16": {"enabled": true}'
  [ "$prec" = fp8 ] && mp=', "bf16": {"enabled": true}, "fp8": {"enabled": true}'
  [ "$prec" = fp8ag ] && mp=', "bf16": {"enabled": true}, "fp8": {"enabled": true, "all_gather": true}'
  cat >"$work/$name.json" <<EOF
{"model": {"type": "$type", "vocab_size": $vocab, "n_layer": $layers, "n_head": $heads,
           "d_model": $d, "seq_len": $T$kvkey},
 "data": {"train": "$work/train.bin"}, "train_micro_batch_size_per_gpu": $mb,
 "gradient_accumulation_steps": 1, "train_steps": 3, "threads": $threads,
 "zero_optimization": {"stage": $stage}, "run_dir": "$work/run_$name"$mp}
EOF
  if [ "$ranks" = 1 ]; then
    env "${lowp[@]}" "$sw" train "$work/$name.json" </dev/null >"$work/$name.log" 2>&1
  else  # (mpirun reads stdin: not the cases)
    timeout 300 env "${lowp[@]}" "${mpirun[@]}" -np "$ranks" "$sw" train "$work/$name.json" \
      </dev/null >"$work/$name.log" 2>&1
  fi || { cat "$work/$name.log"; fail "$name: training failed"; }
  env "${lowp[@]}" "$sw" plan "$work/$name.json" --world-size "$ranks" --json </dev/null \
    >"$work/plan_$name.json" \
    2>"$work/plan_$name.err" || { cat "$work/plan_$name.err"; fail "$name: plan failed"; }
  /usr/bin/python3 - "$name" "$ranks" "$work/plan_$name.json" "$work/run_$name/metrics.jsonl" <<'PY' || bad=1
import json, sys
name, ranks, plan, metrics = sys.argv[1:]
dev = json.load(open(plan))["ranks"][0]["tiers"]["device"]
m = [json.loads(l) for l in open(metrics) if '"peak_mem_bytes"' in l]
measured = max(x["peak_mem_bytes"] for x in m)
p = dev["peak_bytes"]
assert p == dev["plan_peak_bytes"] + dev["kernel_workspace_bytes"], dev
d = measured - p
print("%-13s %6s %12d %12d %12d %12d %+9d" % (name, ranks, dev["plan_peak_bytes"],
                                              dev["kernel_workspace_bytes"], p, measured, d))
sys.exit(0 if abs(d) <= max(8192, 0.002 * measured) else 1)
PY
done <<<"$cases"
[ "$bad" = 0 ] || fail "a planned device peak is off the measured tracked peak by more than max(8 KiB, 0.2%)"
echo "plan_vs_measured: ok"
