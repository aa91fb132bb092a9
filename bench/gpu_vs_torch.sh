#!/usr/bin/env bash
# gpu_vs_torch.sh: Shardwise against PyTorch on one GPU, the issue's performance comparison, in
# one command: GPT-2 124M (T 1024) and a 1.3B Llama (T 2048), bf16 compute with fp32 master
# weights and AdamW, the same shapes and micro-batch for every engine. Shardwise runs the way
# users run it (`shardwise train`: trainer loop, data loader, metrics), 1 rank (sharding is
# trivial), no offload, no activation checkpointing, gradients freed between steps
# (release_grads, as the peer's zero_grad(set_to_none=True)); tokens/s is the median over the steps after
# the warm-up from its metrics.jsonl. PyTorch (bench/torch_gpu_step.py) runs eager and
# torch.compile, tuned as issue 39 asks ("pytorch compile": the loss inside the compiled graph,
# the fastest SDPA backend by timing, fused q|k|v and gate|up, fused AdamW, no host
# synchronisation in the timed window), and compiled the plain user's way ("pytorch
# compile-plain", the engine compile_plain: torch_gpu_step.py --plain, the figure reported
# before issue 39); the table gives Shardwise's ratio to both. On a GPU, Shardwise runs twice per model: as users run it, then with each CUDA
# op timed ("shardwise op-times": op_times_MODEL.tsv, each op's share of the step); --order can
# add its flash-style attention kernels ("shardwise flash-attn", SHARDWISE_CUDA_ATTENTION=flash)
# and cuDNN's fused attention ("shardwise cudnn-attn", SHARDWISE_CUDA_ATTENTION=cudnn; the
# default path since 2026-11-27) or the cuBLAS path it replaced ("shardwise cublas-attn").
# Prints a table (model, engine, tokens/s, MFU, ratio to PyTorch compiled) and
# writes gpu_vs_torch.json (every run, and the machine) and the runs' logs to --out.
#
#   bash bench/gpu_vs_torch.sh [--quick] [options]          (on the GPU machine; ~4-6 minutes)
#   bash bench/gpu_vs_torch.sh --device cpu --tiny           (any machine: every path, tiny models)
#     --quick          GPT-2 only (~1-2 minutes)
#     --device D       cuda (default) or cpu (Shardwise "device", PyTorch --device)
#     --tiny           tiny models (2 layers, d 64, vocab 256, T 64): a smoke test of the harness
#     --build DIR      where tools/shardwise is (default build-gpu if it has one, else build)
#     --out DIR        where gpu_vs_torch.json, the table and run logs go (default $OUT, if set)
#     --python PY      the python with PyTorch (default: python3, else /usr/bin/python3)
#     --steps N        timed steps per run (default 5; Llama 3)
#     --warmup N       untimed steps first (default 3; Llama 2)
#     --rounds N       alternate the engines N times (Shardwise, compile, eager, ...; default 1);
#                      the table shows each engine's best round
#     --gpt2-batch B   GPT-2 micro-batch (default 16)     --llama-batch B  Llama's (default 4)
#     --llama-kv-heads K  8 for grouped-query attention (default 16)
#     --budget S       seconds for the whole comparison (default 330); each run is capped at
#                      what is left (and at its own cap), a run that does not fit is skipped
#     --peak-flops F   for MFU (default 989e12: H100/H200 SXM dense bf16)
#     --no-compile     skip torch.compile (e.g. a PyTorch without a working Triton)
#     --order LIST     the runs in this order, MODEL:ENGINE comma-separated (models gpt2, llama;
#                      engines shardwise, shardwise_flash, shardwise_cudnn, shardwise_cublas,
#                      shardwise_optimes, shardwise_cudnn_optimes, compile, eager,
#                      compile_plain, eager_plain (the peer with --plain);
#                      shardwise_cudnn / _cublas: SHARDWISE_CUDA_ATTENTION=cudnn / cublas;
#                      shardwise_optimes: each CUDA op's time, op_times_MODEL.tsv;
#                      shardwise_profile: `shardwise profile` (the warm-up steps and one
#                      more, all but the first recorded) into profile_MODEL/, with the
#                      compute track's busy share of each recorded step;
#                      shardwise_selective: selective activation checkpointing (norms and
#                      activation functions recomputed in backward, as torch.compile's
#                      partitioner recomputes pointwise ops: 3.4 GiB less at the 1.3B Llama);
#                      shardwise_chunkN: the cuBLAS attention path with N query rows per
#                      chunk, SHARDWISE_CUDA_ATTENTION_CHUNK=N, e.g. 32 keeps a 1.3B Llama's
#                      scores in L2, by default up to 256 MiB of them), e.g. to measure
#                      what matters most first when the budget is short; default: per model,
#                      shardwise, compile, compile_plain, eager, then on a GPU shardwise_cublas and
#                      shardwise_optimes
# Memory (`shardwise plan` of these configs on a device, cuDNN's attention, 2026-11-30): GPT-2 B 16
# 9.76 GiB (selective 8.10), Llama B 4 34.23 GiB (selective 30.81); without release_grads 10.08
# and 39.06, which an H200 measured (10.01 and 39.04 GiB, 2026-11-28). The tuned peer measured
# 8.4 and 33.6 GiB there.
# The token files are uniform random ids over each model's vocabulary, written in llm.c's format
# here (`shardwise data prepare` tokenises bytes: 256 ids only). MFU = tokens/s x (6 N + 12 L d T)
# / peak, N from the shape (torch_gpu_step.py --shape-only; PyTorch's model has the same count).
# A run that fails, runs out of memory or time prints its status in the table, not a number;
# exit status 0 when every run that was not skipped produced a figure, else 1.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$PWD
export LC_ALL=C

quick="" device=cuda tiny="" build="" out=${OUT:-} py=${PYTHON:-} steps="" warmup="" rounds=1
gpt2_batch="" llama_batch="" kv_heads="" budget=330 peak=989e12 no_compile="" order=""
while (($#)); do
  a=$1
  case $a in
    --*=*) set -- "${a%%=*}" "${a#*=}" "${@:2}"; continue ;;
  esac
  need() { [ $# -ge 2 ] || { echo "gpu_vs_torch: $1 needs a value" >&2; exit 2; }; }
  case $a in
    --quick) quick=1 ;;
    --tiny) tiny=1 ;;
    --no-compile) no_compile=1 ;;
    --device) need "$@"; device=$2; shift ;;
    --build) need "$@"; build=$2; shift ;;
    --out) need "$@"; out=$2; shift ;;
    --python) need "$@"; py=$2; shift ;;
    --steps) need "$@"; steps=$2; shift ;;
    --warmup) need "$@"; warmup=$2; shift ;;
    --rounds) need "$@"; rounds=$2; shift ;;
    --order) need "$@"; order=$2; shift ;;
    --gpt2-batch) need "$@"; gpt2_batch=$2; shift ;;
    --llama-batch) need "$@"; llama_batch=$2; shift ;;
    --llama-kv-heads) need "$@"; kv_heads=$2; shift ;;
    --budget) need "$@"; budget=$2; shift ;;
    --peak-flops) need "$@"; peak=$2; shift ;;
    -h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$repo/bench/gpu_vs_torch.sh"; exit 0 ;;
    *) echo "gpu_vs_torch: unknown argument '$a' (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done
for v in "$rounds" "$budget" ${steps:+"$steps"} ${warmup:+"$warmup"} ${gpt2_batch:+"$gpt2_batch"} \
         ${llama_batch:+"$llama_batch"} ${kv_heads:+"$kv_heads"}; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "gpu_vs_torch: '$v' is not a whole number" >&2; exit 2; }
done
case $device in cpu | cuda | cuda:[0-9]*) ;; *) echo "gpu_vs_torch: --device cpu or cuda" >&2; exit 2 ;; esac

# The unpacked packages of scripts/gpu_build.sh (OpenMPI, OpenBLAS, ...), when there are any.
prefix=${SW_PREFIX:-/tmp/swprefix}
# shellcheck disable=SC1091
[ -f "$prefix/env.sh" ] && . "$prefix/env.sh"
if [ -z "$build" ]; then
  build=build
  [ -x build-gpu/tools/shardwise ] && build=build-gpu
fi
sw=$(cd "$build" 2>/dev/null && pwd)/tools/shardwise
[ -x "$sw" ] || { echo "gpu_vs_torch: no $build/tools/shardwise (build it: cmake --build $build --target shardwise)" >&2; exit 2; }
if [ -z "$py" ]; then
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import torch' 2>/dev/null; then py=$p; break; fi
  done
  [ -n "$py" ] || { echo "gpu_vs_torch: no python3 with torch (give --python)" >&2; exit 2; }
fi
peer=$repo/bench/torch_gpu_step.py

work=$(mktemp -d /tmp/sw_gpu_vs_torch.XXXXXX)  # the token files (not sent back with $OUT)
trap 'rm -rf "$work"' EXIT
if [ -n "$out" ]; then
  mkdir -p "$out/gpu_vs_torch_runs" || exit 2
  runs=$(cd "$out" && pwd)/gpu_vs_torch_runs
else
  runs=$work/runs
  mkdir -p "$runs"
fi
# torch.compile's caches kept between invocations: a second run on a warm machine compiles
# from cache (minutes saved at 1.3B).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/sw_inductor_cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/sw_triton_cache}
t_begin=$SECONDS
left() { echo $((budget - (SECONDS - t_begin))); }

models="gpt2 llama"
[ -n "$quick" ] && models=gpt2
engines="shardwise compile compile_plain eager"
[ -n "$no_compile" ] && engines="shardwise eager"
# On a GPU, Shardwise with cuDNN's fused attention, then again with each CUDA op timed
# (SHARDWISE_CUDA_OP_TIMES: where the step's time goes), after the peers so that they are
# measured first when the budget runs short. The flash-style attention kernels
# (shardwise_flash; 6x slower at their first H100 run) only by --order.
[[ $device == cuda* ]] && engines="$engines shardwise_cublas shardwise_optimes"
plan=()  # MODEL:ENGINE, one round
if [ -n "$order" ]; then
  models=""
  for p in ${order//,/ }; do
    m=${p%%:*} e=${p#*:}
    [[ $p == *:* && ($m == gpt2 || $m == llama) ]] ||
      { echo "gpu_vs_torch: --order: '$p' is not MODEL:ENGINE with MODEL gpt2 or llama" >&2; exit 2; }
    case $e in shardwise | shardwise_flash | shardwise_cudnn | shardwise_cublas | shardwise_optimes | shardwise_cudnn_optimes | shardwise_profile | shardwise_selective | shardwise_chunk[1-9]* | compile | eager | compile_plain | eager_plain) ;;
      *) echo "gpu_vs_torch: --order: engine '$e' is not shardwise, shardwise_flash, shardwise_cudnn, shardwise_cublas, shardwise_optimes, shardwise_cudnn_optimes, shardwise_profile, shardwise_selective, shardwise_chunkN, compile, eager, compile_plain or eager_plain" >&2; exit 2 ;;
    esac
    plan+=("$p")
    [[ " $models " == *" $m "* ]] || models="$models${models:+ }$m"
  done
else
  for m in $models; do for e in $engines; do plan+=("$m:$e"); done; done
fi
tiny_flag=${tiny:+--tiny}
threads_cpu=$(($(nproc) < 4 ? $(nproc) : 4))

echo "== gpu_vs_torch: $models on $device${tiny:+ (tiny)}, shardwise $sw, python $py, budget ${budget}s"
if [[ $device == cuda* ]]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null |
    sed 's/^/gpu: /'
fi

# Per model: the shape (from the peer, the one place it is written), the run's lengths, the data.
declare -A shape_json steps_of warmup_of batch_of cap_sw cap_eager cap_compile
for m in $models; do
  if [ $m = gpt2 ]; then
    b=${gpt2_batch:-0} st=${steps:-5} wu=${warmup:-3}
    cap_sw[$m]=90 cap_eager[$m]=60 cap_compile[$m]=120
  else
    b=${llama_batch:-0} st=${steps:-3} wu=${warmup:-2}
    cap_sw[$m]=150 cap_eager[$m]=90 cap_compile[$m]=200
  fi
  steps_of[$m]=$st warmup_of[$m]=$wu
  s=$("$py" "$peer" --model $m $tiny_flag --shape-only --batch "$b" ${kv_heads:+--kv-heads $kv_heads}) ||
    { echo "gpu_vs_torch: $peer --shape-only failed" >&2; exit 1; }
  shape_json[$m]=$s
  batch_of[$m]=$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["batch"])' "$s")
  # Token file: enough tokens for a few hundred rows; uniform ids below the vocabulary.
  "$py" - "$s" "$work/$m.bin" <<'PY' || { echo "gpu_vs_torch: writing $work/$m.bin failed" >&2; exit 1; }
import array, json, os, struct, sys
s = json.loads(sys.argv[1])
n = max(1 << 20, 64 * (s["T"] + 1))
raw = array.array("H", os.urandom(2 * n))
toks = array.array("H", (t % s["vocab"] for t in raw))
with open(sys.argv[2] + ".tmp", "wb") as f:  # llm.c's header: magic, version, count, 253 zeros
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(toks.tobytes())  # little-endian uint16 (x86-64)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
PY
done

# run_shardwise MODEL ROUND [VARIANT] -> one JSON line on stdout (the run's log and metrics in
# $runs); VARIANT: "" (the default attention path), flash or cudnn (SHARDWISE_CUDA_ATTENTION),
# optimes (the default path with SHARDWISE_CUDA_OP_TIMES: each CUDA op's total time, written to
# op_times_MODEL.tsv beside the table and its head to stderr; its tokens/s carry the timing's
# cost, so it is its own row) or cudnn_optimes (the same with cuDNN's attention:
# op_times_MODEL_cudnn.tsv).
run_shardwise() {
  local m=$1 r=$2 variant=${3:-} dir=$runs/shardwise${3:+_$3}_${1}_r$2 cap t rc attn="" optimes=""
  local chunk="" prof=""
  case $variant in
    flash | cudnn | cublas) attn=$variant ;;
    chunk*) chunk=${variant#chunk} ;;
    optimes) optimes=${out:-$runs}/op_times_$m.tsv ;;
    profile) prof=${out:-$runs}/profile_$m ;;
    cudnn_optimes) attn=cudnn optimes=${out:-$runs}/op_times_${m}_cudnn.tsv ;;
  esac
  cap=${cap_sw[$m]}
  t=$(left)
  ((t - 5 < cap)) && cap=$((t - 5))
  rm -rf "$dir"
  mkdir -p "$dir"
  if ((cap < 15)); then
    echo '{"engine": "shardwise", "attention": "'${attn:-default}'", "model": "'$m'", "round": '$r', "status": "skipped", "error": "budget"}'
    return
  fi
  "$py" - "${shape_json[$m]}" "$work/$m.bin" "$dir" "$device" "$((${warmup_of[$m]} + ${steps_of[$m]}))" \
    "$threads_cpu" "$variant" >"$dir/config_in.json" <<'PY'
import json, sys
s = json.loads(sys.argv[1])
model = {"type": s["model"], "vocab_size": s["vocab"], "n_layer": s["layers"], "n_head": s["heads"],
         "d_model": s["d"], "d_ff": s["d_ff"], "seq_len": s["T"]}
if s["model"] == "llama":
    model["n_kv_head"] = s["kv_heads"]
else:
    model["tie_embeddings"] = True
cfg = {"model": model, "data": {"train": sys.argv[2]}, "run_dir": sys.argv[3] + "/run",
       "device": sys.argv[4], "bf16": {"enabled": True},  # fp32 masters, bf16 compute
       "train_micro_batch_size_per_gpu": s["batch"], "gradient_accumulation_steps": 1,
       "train_steps": int(sys.argv[5]), "seed": 1337,
       "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
       "scheduler": {"type": "Constant"}, "gradient_clipping": 1.0,
       "zero_optimization": {"stage": 3}, "activation_checkpointing": "off",
       # the peer's zero_grad(set_to_none=True): no gradient memory between steps
       "release_grads": True,
       "eval_every_steps": 0, "log_every_steps": 1}
if sys.argv[4] == "cpu":
    cfg["threads"] = int(sys.argv[6])
if sys.argv[7] == "selective":  # norms and activation functions recomputed in backward
    cfg["activation_checkpointing"] = "selective"
print(json.dumps(cfg, indent=1))
PY
  # What `shardwise plan` predicts for the run's device peak (the same attention path), beside
  # the measured peak in the record: the planner checked on every run.
  (if [ -n "$attn" ]; then export SHARDWISE_CUDA_ATTENTION=$attn; else unset SHARDWISE_CUDA_ATTENTION; fi
   exec timeout 30 "$sw" plan "$dir/config_in.json" --json) >"$dir/plan.json" 2>"$dir/plan.err"
  local t0=$SECONDS
  (if [ -n "$attn" ]; then export SHARDWISE_CUDA_ATTENTION=$attn; else unset SHARDWISE_CUDA_ATTENTION; fi
   if [ -n "$optimes" ]; then export SHARDWISE_CUDA_OP_TIMES=$optimes; else unset SHARDWISE_CUDA_OP_TIMES; fi
   if [ -n "$chunk" ]; then export SHARDWISE_CUDA_ATTENTION_CHUNK=$chunk; else unset SHARDWISE_CUDA_ATTENTION_CHUNK; fi
   if [ -n "$prof" ]; then
     rm -rf "$prof"
     # (the warm-up steps and one more: its tokens/s is that step's)
     exec timeout -k 10 "$cap" "$sw" profile "$dir/config_in.json" --steps "$((${warmup_of[$m]} + 1))" \
       --out "$prof" --quiet
   fi
   exec timeout -k 10 "$cap" "$sw" train "$dir/config_in.json" --quiet --no-export) >"$dir/log.txt" 2>&1
  rc=$?
  if [ -n "$prof" ]; then
    # The profile's metrics are in its own folder; the compute track's busy share per recorded
    # step, from the trace (on a GPU the device's times: docs/ARCHITECTURE.md, "Profiler").
    mkdir -p "$dir/run" && cp "$prof/metrics.jsonl" "$dir/run/" 2>/dev/null
    "$py" - "$prof/trace_rank0.json" "$m" >&2 <<'PY' || echo "  $m profile: no trace" >&2
import json, sys
allev = json.load(open(sys.argv[1]))["traceEvents"]
ev = [e for e in allev if e.get("ph") == "X"]
# The trace's tracks (issue 39: compute, and where the run has them the collectives' and the
# copies' queues), with their action counts.
names = {e.get("tid"): e["args"]["name"] for e in allev
         if e.get("ph") == "M" and e.get("name") == "thread_name"}
print(f"  {sys.argv[2]} profile: tracks " + ", ".join(
    f"{names[t]} ({sum(1 for e in ev if e.get('tid') == t)})" for t in sorted(names)))
coarse = {"step", "forward_backward", "grad_norm", "optimizer", "skip_step", "evaluate"}
steps = [e for e in ev if e["name"].split(" ")[0] == "step"]
for st in steps:
    t0, t1 = st["ts"], st["ts"] + st["dur"]
    comp = [e for e in ev if e.get("tid") == 1 and e["name"].split(" ")[0] not in coarse
            and t0 <= e["ts"] <= t1]
    waits = sum(e["dur"] for e in comp if e["name"].startswith("wait_"))
    busy = sum(e["dur"] for e in comp) - waits
    print(f"  {sys.argv[2]} profile: step {st.get('args', {}).get('step')}: {st['dur'] / 1e3:.1f} ms, "
          f"compute track busy {100 * busy / st['dur']:.1f}%, in waits {100 * waits / st['dur']:.1f}% "
          f"({len(comp)} actions)")
PY
  fi
  if [ -n "$optimes" ]; then
    if [ -s "$optimes" ]; then head -22 "$optimes" | sed "s/^/  $m op times: /" >&2
    else echo "  $m op times: none written (not a CUDA build, or the run did not end normally)" >&2; fi
  fi
  "$py" - "$m" "$r" "$rc" "$cap" "$((SECONDS - t0))" "${warmup_of[$m]}" "${shape_json[$m]}" "$dir" "$peak" "${attn:-default}" "$variant" <<'PY'
import json, statistics, sys
m, r, rc, cap, wall, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5]), int(sys.argv[6])
s, d, peak = json.loads(sys.argv[7]), sys.argv[8], float(sys.argv[9])
rec = {"engine": "shardwise", "mode": "train", "attention": sys.argv[10], "model": m, "round": r,
       "batch": s["batch"],
       "T": s["T"], "params": s["params"], "flops_per_token": s["flops_per_token"],
       "peak_flops": peak, "exit": rc, "wall_s": wall, "run_dir": d}
if sys.argv[11] == "optimes":
    rec["variant"] = "op-times"
elif sys.argv[11] == "profile":
    rec["variant"] = "profiled"
elif sys.argv[11] == "cudnn_optimes":
    rec["variant"] = "cudnn-attn op-times"
elif sys.argv[11].startswith("chunk") or sys.argv[11] == "selective":
    rec["variant"] = sys.argv[11]
lines = []
try:
    for l in open(d + "/run/metrics.jsonl"):
        j = json.loads(l)
        if "step_time_s" in j and j.get("step_time_s"):
            lines.append(j)
except OSError:
    pass
log = [l.strip() for l in open(d + "/log.txt", errors="replace") if l.strip()]
err = next((l for l in reversed(log) if "error" in l.lower()), log[-1] if log else "")
timed = [j for j in lines if j["step"] > warm]
partial = False
if not timed and lines:  # killed during the warm-up: the last step it finished, marked
    timed, partial = lines[-1:], True
if timed:
    st = [j["step_time_s"] for j in timed]
    tok_step = timed[0]["tokens_per_s"] * timed[0]["step_time_s"]
    med = statistics.median(st)
    rec.update(step_s=med, step_s_all=[round(x, 6) for x in st], tokens_per_s=tok_step / med,
               tokens_per_s_mean=tok_step * len(st) / sum(st),
               mfu=tok_step / med * s["flops_per_token"] / peak, steps_timed=len(st),
               steps_done=lines[-1]["step"], first_step_s=lines[0]["step_time_s"],
               max_mem_allocated_bytes=max(j.get("peak_mem_bytes", 0) for j in lines),
               loss=lines[-1].get("loss"))
    reads = [j["norm_read_s"] for j in timed if "norm_read_s" in j]
    if reads:  # the host's wait for the GPU at the step's one read (near 0: host-bound)
        rec["norm_read_s"] = statistics.median(reads)
if rc == 0 and timed and not partial:
    rec["status"] = "ok"
elif rc in (124, 137):
    rec["status"] = "timeout"
    rec["error"] = f"stopped after {cap}s cap" + (" (warm-up step only)" if partial else "")
else:
    rec["status"] = "failed" if rc else "no_steps"
    rec["error"] = err[:300]
try:
    r0 = json.load(open(d + "/plan.json"))["ranks"][0]
    rec["planned_device_bytes"] = r0["tiers"]["device"]["peak_bytes"]  # (kernel workspace included)
except (OSError, ValueError, KeyError, IndexError):
    pass
# A shape cuDNN refused (the run then took the cuBLAS path): say so beside the figures.
refused = next((l for l in log if "cuDNN attention refused" in l), None)
if refused:
    rec["attention_note"] = refused[:300]
print(json.dumps(rec))
PY
}

# run_torch MODEL ENGINE ROUND -> one JSON line on stdout (ENGINE: compile, eager, or either
# with _plain: the peer's --plain)
run_torch() {
  local m=$1 mode=${2%_plain} r=$3 cap t rc line log=$runs/torch_${1}_${2}_r$3.log plain=""
  [ "$2" != "$mode" ] && plain=--plain
  if [ "$mode" = compile ]; then cap=${cap_compile[$m]}; else cap=${cap_eager[$m]}; fi
  t=$(left)
  ((t - 5 < cap)) && cap=$((t - 5))
  if ((cap < 15)); then
    echo '{"engine": "pytorch", "mode": "'$mode'", "model": "'$m'", "round": '$r', "status": "skipped", "error": "budget"}'
    return
  fi
  local t0=$SECONDS
  timeout -k 10 "$cap" "$py" "$peer" --model "$m" --mode "$mode" --device "$device" $tiny_flag \
    --batch "${batch_of[$m]}" --steps "${steps_of[$m]}" --warmup "${warmup_of[$m]}" \
    --peak-flops "$peak" ${kv_heads:+--kv-heads $kv_heads} $plain \
    $([ "$device" = cpu ] && echo "--threads $threads_cpu") >"$log.out" 2>"$log"
  rc=$?
  line=$(grep '^{' "$log.out" | tail -1)
  "$py" - "$m" "$2" "$r" "$rc" "$cap" "$((SECONDS - t0))" "$line" "$log" <<'PY'
import json, sys
m, mode, r, rc, cap, wall, line, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8]
rec = json.loads(line) if line else {"engine": "pytorch", "mode": mode.replace("_plain", ""),
                                     "model": m, "tuned": not mode.endswith("_plain")}
rec.update(round=r, exit=rc, process_wall_s=wall, log=log)
if rc in (124, 137):
    rec["status"], rec["error"] = "timeout", f"stopped after {cap}s cap"
elif "status" not in rec:
    tail = [l.strip() for l in open(log, errors="replace") if l.strip()]
    rec["status"], rec["error"] = "failed", (tail[-1] if tail else f"exit {rc}")[:300]
print(json.dumps(rec))
PY
}

progress() {  # one line per run as it ends
  "$py" - "$1" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
who = (j.get("mode", "?") + ("" if j.get("tuned", True) else "-plain")) if j["engine"] == "pytorch" else (
    "sw-" + j["variant"] if j.get("variant") else
    "shardwise" if j.get("attention", "default") == "default" else "sw-" + j["attention"])
fig = (f"{j['tokens_per_s']:.0f} tok/s, MFU {100 * j['mfu']:.1f}%" if "tokens_per_s" in j
       else j.get("error", ""))
print(f"  {j['model']:5s} {who:9s} round {j['round']}: {j['status']:8s} {fig}", flush=True)
PY
}
# One line per run as it finishes (with --out: in the runs folder, so that a command stopped
# from outside still leaves the runs it finished).
results=$runs/results.jsonl
: >"$results"
for ((r = 1; r <= rounds; r++)); do
  for p in "${plan[@]}"; do
    m=${p%%:*} e=${p#*:}
    case $e in
      shardwise) line=$(run_shardwise "$m" "$r") ;;
      shardwise_flash) line=$(run_shardwise "$m" "$r" flash) ;;
      shardwise_cudnn) line=$(run_shardwise "$m" "$r" cudnn) ;;
      shardwise_cublas) line=$(run_shardwise "$m" "$r" cublas) ;;
      shardwise_optimes) line=$(run_shardwise "$m" "$r" optimes) ;;
      shardwise_profile) line=$(run_shardwise "$m" "$r" profile) ;;
      shardwise_cudnn_optimes) line=$(run_shardwise "$m" "$r" cudnn_optimes) ;;
      shardwise_chunk*) line=$(run_shardwise "$m" "$r" "${e#shardwise_}") ;;
      shardwise_selective) line=$(run_shardwise "$m" "$r" selective) ;;
      *) line=$(run_torch "$m" "$e" "$r") ;;
    esac
    echo "$line" >>"$results"
    progress "$line"
  done
done

"$py" - "$results" "${out:-}" "$device" "$budget" "$((SECONDS - t_begin))" "$sw" "$repo" <<'PY'
import json, os, platform, subprocess, sys
res = [json.loads(l) for l in open(sys.argv[1])]
out, device, budget, elapsed, sw, repo = sys.argv[2], sys.argv[3], int(sys.argv[4]), \
    int(sys.argv[5]), sys.argv[6], sys.argv[7]

def name(j):
    if j["engine"] == "shardwise":
        if j.get("variant"):
            return "shardwise " + j["variant"]
        a = j.get("attention", "default")
        return "shardwise" if a == "default" else "shardwise " + a + "-attn"
    return "pytorch " + j.get("mode", "?") + ("" if j.get("tuned", True) else "-plain")

def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001
        return ""

best = {}  # (model, engine) -> the round with most tokens/s, else the last round's record
for j in res:
    k = (j["model"], name(j))
    if k not in best or j.get("tokens_per_s", -1) > best[k].get("tokens_per_s", -1):
        best[k] = j
models = list(dict.fromkeys(j["model"] for j in res))
lines = ["model  engine                         batch  T      tokens/s    MFU  step s  read s  max mem GiB  plan GiB  vs compiled  vs plain  status"]
for m in models:
    ref = best.get((m, "pytorch compile"), {}).get("tokens_per_s")  # the tuned peer
    ref_plain = best.get((m, "pytorch compile-plain"), {}).get("tokens_per_s")
    chunks = sorted({e for (mm, e) in best if mm == m and e.startswith("shardwise chunk")},
                    key=lambda e: int(e[len("shardwise chunk"):]))
    for e in ["shardwise", "shardwise selective", "shardwise cudnn-attn", "shardwise cublas-attn", "shardwise flash-attn",
              "shardwise op-times", "shardwise profiled",
              "shardwise cudnn-attn op-times", *chunks,
              "pytorch eager-plain", "pytorch eager", "pytorch compile-plain", "pytorch compile"]:
        j = best.get((m, e))
        if j is None:
            continue
        tok = j.get("tokens_per_s")
        mem = j.get("max_mem_allocated_bytes")
        lines.append(
            f"{m:6s} {e:29s} {j.get('batch', '-')!s:>6} {j.get('T', '-')!s:>5} "
            + (f"{tok:11.0f} {100 * j['mfu']:5.1f}% {j['step_s']:7.3f}" if tok else f"{'-':>11} {'-':>6} {'-':>7}")
            + (f" {j['norm_read_s']:7.3f}" if j.get("norm_read_s") is not None else f" {'-':>7}")
            + (f" {mem / 2**30:12.2f}" if mem else f" {'-':>12}")
            + (f" {j['planned_device_bytes'] / 2**30:9.2f}" if j.get("planned_device_bytes") else f" {'-':>9}")
            + (f" {tok / ref:11.2f}x" if tok and ref else f" {'-':>12}")
            + (f" {tok / ref_plain:8.2f}x" if tok and ref_plain else f" {'-':>9}")
            + f"  {j['status']}" + (f": {j['error']}" if j.get("error") and j["status"] != "ok" else ""))
targets = ("max mem: PyTorch max_memory_allocated, Shardwise's tracked peak (peak_mem_bytes); "
           "plan: what `shardwise plan` predicted for it; read s: Shardwise's median wait for the "
           "device at the step's one read (norm_read_s; near 0: the host's issuing sets the pace)\n"
           "pytorch compile: the tuned peer (loss in the graph, fastest SDPA backend, fused "
           "projections and AdamW, no sync in the timed window); compile-plain: --plain\n"
           "targets: shardwise >= 1.1x pytorch compile (tuned) tokens/s, peak memory at or below "
           "it (issue 39)")
peak = next((j.get("peak_flops") for j in res if j.get("peak_flops")), 989e12)
note = (f"MFU = tokens/s x (6N + 12 L d T) / {peak:.4g} FLOP/s; tokens/s: median step after the "
        f"warm-up; best of {max(j['round'] for j in res)} round(s); {elapsed}s of {budget}s budget")
table = "\n".join(lines + [note, targets])
print()
print(table)
env = {"device": device, "host": platform.node(), "cpu_count": os.cpu_count(),
       "gpu": sh(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                  "--format=csv,noheader"]) if device.startswith("cuda") else None,
       "shardwise": sw, "shardwise_version": sh([sw, "--version"]),
       "git": sh(["git", "-C", repo, "rev-parse", "--short", "HEAD"]) or None,
       "torch": next((j.get("torch") for j in res if j.get("torch")), None),
       "elapsed_s": elapsed, "budget_s": budget}
if out:
    with open(os.path.join(out, "gpu_vs_torch.json"), "w") as f:
        json.dump({"env": env, "best": [best[k] for k in best], "runs": res}, f, indent=1)
    with open(os.path.join(out, "gpu_vs_torch.txt"), "w") as f:
        f.write(table + "\n")
    print(f"wrote {out}/gpu_vs_torch.json, gpu_vs_torch.txt, gpu_vs_torch_runs/")
bad = [j for j in res if j["status"] not in ("ok", "skipped", "unavailable")]
sys.exit(1 if bad else 0)
PY
