#!/bin/bash
# Checkpoints and export across pipeline degrees (issue 37 point 4; label mpi). A 4-layer GPT-2
# (tied embedding and head: a unit the first and the last stage both hold) trained 6 steps,
# saving at steps 3 and 6, at one rank (ref) and at pipeline degree 2 (pp2, async saves); then
# resumed from step 3:
#   pp2's at P = 1, at P = 2 (bit-identical to pp2: every step's loss and grad norm, and the
#   exported weights byte for byte) and at P = 4; ref's at P = 2;
#   pipeline 2 x FULL_SHARD 2 and pipeline 2 x tensor 2 (v2) saves at P = 1 (the same global
#   batch: train_micro_batch_size_per_gpu is per data-parallel rank);
#   pipeline 2 with 2 interleaved virtual stages per rank at P = 1; Llama (untied) at P = 1;
#   bf16 at P = 2 (bit-identical);
# and 2 steps from ref's exported weights (checkpoint.init_from) at P = 2 against P = 1.
# Steps 4-6 must give the saving run's loss and grad norm within 1e-5 relative. The P = 2
# checkpoint's metadata must describe the whole model as ref's does (same units), each unit in
# one file; `ckpt verify` passes; the end-of-run export of pp2 (<run_dir>/hf, cut into several
# files by checkpoint.export_shard_bytes, so files span stages) and `ckpt export` of its
# step 6 (directory and single file) must hold ref's tensors (names, shapes, files, index) with
# values within 1e-5 (|a - b| / (1 + |b|)), and `ckpt export` equal to the live export exactly.
# Usage: mpi_pipeline_ckpt.sh SHARDWISE MPIEXEC [mpirun flags...]
set -u
source "$(dirname "${BASH_SOURCE[0]}")/mpi_common.sh" mpi_pipeline_ckpt "$@"
prepare_text 2000
cat >"$work/cfg.json" <<EOF
{
  "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 4, "n_head": 2, "d_model": 32,
            "seq_len": 16},
  "data": {"train": "$work/train.bin"},
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "train_steps": 6,
  "threads": 1, "optimizer": {"params": {"lr": 0.003}}, "gradient_clipping": 1.0,
  "scheduler": {"params": {"warmup_num_steps": 2, "total_num_steps": 6}},
  "checkpoint": {"every_steps": 3, "export_shard_bytes": 60000}
}
EOF
export OMP_NUM_THREADS=1
# run NAME RANKS PIPELINE [--set ...]: a run in $work/NAME (its log $work/NAME.log)
run() {
  local name=$1 np=$2 p=$3
  shift 3
  timeout 120 "${mpirun[@]}" -np "$np" "$sw" train "$work/cfg.json" --quiet \
    --set run_dir="$work/$name" --set parallelism.pipeline_parallel_degree="$p" "$@" \
    >"$work/$name.log" 2>&1 || { local rc=$?; cat "$work/$name.log"; fail "$name: exit status $rc"; }
}
run ref 1 1
run pp2 2 2 --set checkpoint.async=true  # (the snapshot path; the others save synchronously)
s3=$work/pp2/checkpoints/step_3
[ -f "$s3/metadata.json" ] || fail "no $s3"
run r_p1 1 1 --set checkpoint.resume="$s3"
run r_p2 2 2 --set checkpoint.resume="$s3"
run r_p4 4 4 --set checkpoint.resume="$s3"
run r_1to2 2 2 --set checkpoint.resume="$work/ref/checkpoints/step_3"
run pp2d2 4 2 --set sharding_strategy=FULL_SHARD --set train_micro_batch_size_per_gpu=1
run pp2t2 4 2 --set parallelism.tensor_parallel_degree=2
grep -q '"format_version": 2' "$work/pp2t2/checkpoints/step_3/metadata.json" ||
  fail "pipeline 2 x tensor 2 did not save v2"
run r_d2 1 1 --set checkpoint.resume="$work/pp2d2/checkpoints/step_3" --no-export
run r_t2 1 1 --set checkpoint.resume="$work/pp2t2/checkpoints/step_3" --no-export
# Interleaved virtual stages (2 per rank: a rank holds units that are not consecutive).
run pp2v2 2 2 --set parallelism.pipeline_parallel_schedule=Interleaved1F1B \
  --set parallelism.pipeline_parallel_virtual_stages=2 --no-export
run r_v2 1 1 --set checkpoint.resume="$work/pp2v2/checkpoints/step_3" --no-export
# Llama (untied: no shared unit) at P = 2 resumed at P = 1; bf16 (an fp32 master beside the
# rounded compute copy) at P = 2 resumed at P = 2.
run lpp2 2 2 --set model.type=llama --no-export
run lr_p1 1 1 --set model.type=llama --set checkpoint.resume="$work/lpp2/checkpoints/step_3" --no-export
run bpp2 2 2 --set bf16.enabled=true --no-export
run br_p2 2 2 --set bf16.enabled=true --set checkpoint.resume="$work/bpp2/checkpoints/step_3" --no-export
# checkpoint.init_from a Hugging Face directory (ref's export) at P = 1 and P = 2
run i_p1 1 1 --set checkpoint.init_from="$work/ref/hf" --set train_steps=2 --no-export
run i_p2 2 2 --set checkpoint.init_from="$work/ref/hf" --set train_steps=2 --no-export
for r in r_p1 r_p2 r_p4; do
  grep -q "resumed from $s3 at step 3" "$work/$r.log" || { cat "$work/$r.log"; fail "$r: no 'resumed from' line"; }
done

"$sw" ckpt verify "$work/pp2/checkpoints/step_6" >"$work/verify.log" 2>&1 ||
  { cat "$work/verify.log"; fail "ckpt verify of the P = 2 checkpoint"; }
"$sw" ckpt inspect "$s3" >"$work/inspect.log" 2>&1 || { cat "$work/inspect.log"; fail "inspect"; }
grep -q "pipeline parallel 2" "$work/inspect.log" || fail "inspect does not say the pipeline degree"
"$sw" ckpt export "$work/pp2/checkpoints/step_6" --out "$work/x_dir" --max-shard-bytes 60000 >"$work/x.log" 2>&1 ||
  { cat "$work/x.log"; fail "ckpt export (directory) of the P = 2 checkpoint"; }
"$sw" ckpt export "$work/pp2/checkpoints/step_6" --out "$work/x.safetensors" >>"$work/x.log" 2>&1 ||
  { cat "$work/x.log"; fail "ckpt export (one file) of the P = 2 checkpoint"; }
for f in "$work"/pp2/hf/*.safetensors; do
  cmp -s "$f" "$work/r_p2/hf/$(basename "$f")" ||
    fail "the P = 2 resumed run's export differs from the uninterrupted run's: $(basename "$f")"
done

python3 - "$work" <<'PY' || fail "checks above"
import glob, json, os, struct, sys
w = sys.argv[1]
bad = 0
def steps(run):
    out = {}
    for line in open(f"{w}/{run}/metrics.jsonl"):
        j = json.loads(line)
        if "loss" in j and "step" in j:
            out[j["step"]] = j
    return out
def close(run, base, exact=False, first=4, last=6):
    global bad
    a, b = steps(base), steps(run)
    want = list(range(first, last + 1))
    if sorted(b) != want:
        print(f"{run}: steps {sorted(b)}, expected {want}"); bad += 1; return
    worst = 0.0
    for s in want:
        for k in ("loss", "grad_norm"):
            if exact and a[s][k] != b[s][k]:
                print(f"{run} step {s} {k}: {b[s][k]!r} != {base}'s {a[s][k]!r}"); bad += 1
            worst = max(worst, abs(b[s][k] - a[s][k]) / abs(a[s][k]))
    print(f"{run} vs {base}, steps {first}-{last}: loss and grad_norm worst relative {worst:.1e}"
          + (" (bit-identical)" if exact and worst == 0 else ""))
    bad += worst > 1e-5
close("pp2", "ref", first=1)
close("r_p1", "pp2")
close("r_p2", "pp2", exact=True)
close("r_p4", "pp2")
close("r_1to2", "ref")
close("pp2d2", "ref", first=1)
close("pp2t2", "ref", first=1)
close("r_d2", "pp2d2")
close("r_t2", "pp2t2")
close("i_p2", "i_p1", first=1, last=2)
close("pp2v2", "ref", first=1)
close("r_v2", "pp2v2")
close("lr_p1", "lpp2")
close("br_p2", "bpp2", exact=True)
if not steps("i_p1")[1]["loss"] < steps("ref")[1]["loss"] - 0.1:
    print("init_from did not start from ref's trained weights"); bad += 1

# The P = 2 checkpoint describes the whole model, each unit written once.
for step in (3, 6):
    m2 = json.load(open(f"{w}/pp2/checkpoints/step_{step}/metadata.json"))
    m1 = json.load(open(f"{w}/ref/checkpoints/step_{step}/metadata.json"))
    if m2["units"] != m1["units"] or m2.get("pipeline_parallel_degree") != 2:
        print(f"step {step}: units or pipeline_parallel_degree differ from ref's"); bad += 1
    files_of = {}
    for f in m2["files"]:
        for t in f["tensors"]:
            files_of.setdefault(t["unit"], set()).add(f["file"])
    if sorted(files_of) != list(range(len(m1["units"]))) or any(len(v) != 1 for v in files_of.values()):
        print(f"step {step}: units by file {files_of}"); bad += 1
print(f"P = 2 metadata: {len(m1['units'])} units as ref's, each in one of "
      f"{len(m2['files'])} files")

def read(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["shape"], struct.unpack(f"<{(v['data_offsets'][1] - v['data_offsets'][0]) // 4}f",
                b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])) for k, v in h.items()}
def read_dir(d):
    files = sorted(os.path.basename(p) for p in glob.glob(f"{d}/*.safetensors"))
    out = {}
    for f in files:
        out.update(read(f"{d}/{f}"))
    index = json.load(open(f"{d}/model.safetensors.index.json")) if len(files) > 1 else None
    return files, out, index
def compare(what, a, b, exact):
    global bad
    if a.keys() != b.keys():
        print(f"{what}: names differ: {sorted(set(a) ^ set(b))}"); bad += 1; return
    worst = 0.0
    for k in a:
        if a[k][0] != b[k][0]:
            print(f"{what}: {k}: shape {a[k][0]} vs {b[k][0]}"); bad += 1
        worst = max(worst, max(abs(x - y) / (1 + abs(y)) for x, y in zip(a[k][1], b[k][1])))
    print(f"{what}: {len(a)} tensors, worst difference {worst:.1e}")
    bad += worst > (0 if exact else 1e-5)
rf, rt, ri = read_dir(f"{w}/ref/hf")
pf, pt, pi = read_dir(f"{w}/pp2/hf")
xf, xt, xi = read_dir(f"{w}/x_dir")
if not (rf == pf == xf and len(rf) > 2 and ri == pi == xi):
    print(f"export files or index differ: ref {rf}, pp2 {pf}, ckpt export {xf}"); bad += 1
print(f"exports: {len(rf)} files each")
compare("pp2/hf vs ref/hf", pt, rt, False)
compare("ckpt export (directory) of pp2 step_6 vs pp2/hf", xt, pt, True)
compare("ckpt export (one file) of pp2 step_6 vs pp2/hf", read(f"{w}/x.safetensors"), pt, True)
compare("r_p1/hf vs pp2/hf", read_dir(f"{w}/r_p1/hf")[1], pt, False)
compare("r_p4/hf vs pp2/hf", read_dir(f"{w}/r_p4/hf")[1], pt, False)
compare("pp2d2/hf vs ref/hf", read_dir(f"{w}/pp2d2/hf")[1], rt, False)
compare("pp2t2/hf vs ref/hf", read_dir(f"{w}/pp2t2/hf")[1], rt, False)
# Files cut across the stage boundary: some file holds tensors of both stages' units.
stage1 = {p["hf_name"] for u in m1["units"][3:4] for p in u["params"]}
stage0 = {p["hf_name"] for u in m1["units"][2:3] for p in u["params"]}
if not any(set(read(f).keys()) & stage0 and set(read(f).keys()) & stage1
           for f in glob.glob(f"{w}/pp2/hf/*.safetensors")):
    print("no export file spans the stage boundary (units 2 and 3)"); bad += 1
sys.exit(1 if bad else 0)
PY
echo "mpi_pipeline_ckpt: ok"
