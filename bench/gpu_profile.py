"""A hardware profile for `shardwise plan --hardware` from what a GPU lease measured, so the
planner's step times come from that card rather than from its datasheet.

    python3 bench/gpu_profile.py --gemm bench_cuda_gemm.log --op-times op_times_llama.tsv \
        --steps 5 --facts facts.log [--base configs/hardware/h100_nccl.json] --out PROFILE.json

Where each figure comes from (the H100 profile's account: bench/results/h100_2026-11-28/NOTES.md,
"A measured hardware profile"):
- compute.gemm_shapes: bench_cuda_gemm's per-shape TFLOP/s of both benchmark models' products
  (cublasGemmEx; forward and dinp with a 16-bit output, dW with an fp32 one, as CudaOps writes
  them; not the LM head's, which has a rate of its own), in the time model's (m, n, k, ta, tb)
  convention; gemm_flops: their median.
- attention_flops, lmhead_flops, optimizer_floats_per_s: the time model's flop (or float) count
  of one step divided by the op-time table's time per step for cuDNN's attention (forward and
  backward), the fused LM head and AdamW (with its 16-bit copies); the table's model is named by
  --model (its shape is the benchmark's).
- elementwise_bytes_per_s: the bytes AdamW moves (30 a parameter: fp32 parameter, gradient and
  two moments read, three written, the 16-bit copy written) over its time: the card's streaming
  rate as one of its own kernels reached it.
- Everything else (collectives, disk, host link) is copied from --base (published figures).
Op-time tables leave each op's first call out: an op's time per step is its mean call time
times (calls + 1) / steps.
"""
import argparse
import json
import re
import statistics

MODELS = {  # bench/gpu_vs_torch.sh's shapes
    "llama": dict(B=4, T=2048, L=24, C=2048, H=16, V=32000, params=1364297728),
    "gpt2": dict(B=16, T=1024, L=12, C=768, H=12, V=50304, params=124475904),
}
ROW = re.compile(r"^(llama|gpt2)\s+(.+?)\s+(\d+)\s+(\d+)\s+(\d+)((?:\s+[\d.]+){6})")


def gemm_points(path):
    pts = []
    for line in open(path):
        m = ROW.match(line)
        if not m or m.group(2).startswith("lm_head"):
            continue
        M, N, K = int(m.group(3)), int(m.group(4)), int(m.group(5))
        cols = [float(x) for x in m.group(6).split()]  # ex_f32 ex_f32_ws ex_bf16 lt_f32 ...
        kind = m.group(2).split()[-1]
        ta, tb = {"fwd": (False, True), "dinp": (False, False), "dw": (True, False)}[kind]
        tflops = cols[0] if kind == "dw" else cols[2]
        pts.append({"m": M, "n": N, "k": K, "ta": ta, "tb": tb, "dtype": "bf16",
                    "flops": tflops * 1e12})
    if not pts:
        raise SystemExit(f"gpu_profile: no products in {path}")
    return pts


def op_seconds_per_step(path, steps):
    per = {}
    for line in open(path):
        if line.startswith(("#", "op\t", " ")):
            continue
        f = line.rstrip("\n").split("\t")
        if len(f) < 4:
            continue
        calls, mean_us = int(f[1]), float(f[3])
        per[f[0]] = mean_us * 1e-6 * (calls + 1) / steps
    return per


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gemm", required=True)
    ap.add_argument("--op-times", required=True)
    ap.add_argument("--steps", type=float, required=True)
    ap.add_argument("--model", default="llama", choices=sorted(MODELS))
    ap.add_argument("--facts", help="gpu_build.sh's facts.log, for the card's name")
    ap.add_argument("--base", default="configs/hardware/h100_nccl.json")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    s = MODELS[a.model]
    N, hd = s["B"] * s["T"], s["C"] // s["H"]
    per = op_seconds_per_step(a.op_times, a.steps)
    # The rows are the CUDA Ops' entries: one per op since the 16-bit forms were folded into
    # their ops (attention_forward, attention_backward, adamw); tables written before then name
    # the 16-bit forms' entries (attention_forward_lp, attention_backward_lp_set, adamw_copies).
    old_names = {"attention_forward": "attention_forward_lp",
                 "attention_backward": "attention_backward_lp_set", "adamw": "adamw_copies"}
    for k, o in old_names.items():
        if k not in per and o in per:
            per[k] = per[o]
    need = ["attention_forward", "attention_backward", "lmhead_xent_into", "adamw"]
    missing = [k for k in need if k not in per]
    if missing:
        raise SystemExit(f"gpu_profile: {a.op_times}: no row for {', '.join(missing)}")
    # The time model's counts (planner/time_model.cpp): causal attention 2 B H T^2 hd forward,
    # 2.5 times that backward, per block; the LM head 6 N V C.
    att = 3.5 * 2.0 * s["B"] * s["H"] * s["T"] ** 2 * hd * s["L"]
    att_s = per["attention_forward"] + per["attention_backward"]
    lm = 6.0 * N * s["V"] * s["C"]
    adam_s = per["adamw"]
    pts = gemm_points(a.gemm)
    first = open(a.gemm).readline()  # "bench_cuda_gemm: NVIDIA H100 80GB HBM3, cuBLAS ..."
    card = first.split(":", 1)[1].split(",")[0].strip() if first.startswith("bench_cuda_gemm:") else ""
    if a.facts:
        for line in open(a.facts):
            if line.startswith("gpus"):
                card = line.split(":", 1)[1].split("(")[0].strip()
    p = json.load(open(a.base))
    p["name"] = f"{card or 'GPU'}: compute measured ({a.model} run), the rest published"
    p["source"] = (f"bench/gpu_profile.py from {a.gemm} (products), {a.op_times} ({a.steps:g} steps of "
                   f"the {a.model} benchmark run: attention, LM head, AdamW) and {a.base} (the rest)")
    c = p["compute"]
    c["gemm_shapes"] = pts
    c["gemm_flops"] = {"f32": c["gemm_flops"]["f32"],
                       "bf16": statistics.median(q["flops"] for q in pts)}
    c["attention_flops"] = {"bf16": att / att_s}
    c["lmhead_flops"] = {"bf16": lm / per["lmhead_xent_into"]}
    c["optimizer_floats_per_s"] = s["params"] / adam_s
    c["elementwise_bytes_per_s"] = 30.0 * s["params"] / adam_s
    with open(a.out, "w") as f:
        json.dump(p, f, indent=2)
        f.write("\n")
    print(f"gpu_profile: {a.out}: {len(pts)} product shapes (median {c['gemm_flops']['bf16'] / 1e12:.0f} "
          f"TFLOP/s), attention {c['attention_flops']['bf16'] / 1e12:.0f} TFLOP/s, LM head "
          f"{c['lmhead_flops']['bf16'] / 1e12:.0f} TFLOP/s, AdamW {c['optimizer_floats_per_s'] / 1e9:.1f} "
          f"G floats/s, streaming {c['elementwise_bytes_per_s'] / 1e12:.2f} TB/s")


if __name__ == "__main__":
    main()
