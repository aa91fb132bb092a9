#!/usr/bin/env python3
"""PyTorch peer for bench/gpu_vs_torch.sh: training steps of GPT-2 124M or a 1.3B Llama on one
GPU, eager or torch.compile, tuned as issue 39 asks (below). Prints one JSON line.

  python3 bench/torch_gpu_step.py --model gpt2 --mode compile --batch 16          # tuned
  python3 bench/torch_gpu_step.py --model gpt2 --mode compile --batch 16 --plain  # the old peer
  /usr/bin/python3 bench/torch_gpu_step.py --device cpu --tiny --model llama   # smoke test

Tuned (the default; each setting has a flag, and --plain sets all four to the plain user's way,
the figure this script gave before issue 39):
  --compile-loss        the loss (bf16 logits upcast to fp32, cross-entropy) inside the compiled
                        graph, so inductor fuses it and no fp32 logits are kept (plain: the
                        model compiled alone, the loss eager on fp32 logits)
  --sdpa-backend auto   the fastest of cuDNN, flash, memory-efficient and math attention, timed
                        on the model's attention shape (forward and backward) before the run
                        and then forced (torch.nn.attention.sdpa_kernel); or one named; plain:
                        "default", PyTorch's own dispatch
  --fused-proj          the Llama's q|k|v and gate|up as one Linear each (GPT-2's c_attn is
                        fused already; it has no gate)
  --no-sync             no host synchronisation inside the timed window: one before the first
                        timed step and one after the last, step time = their span / steps
                        (plain: torch.cuda.synchronize() around every step, the median step)
  --fused-adamw         AdamW(fused=True) (on in both modes, as before; --no-fused-adamw off;
                        on the CPU where torch has it, >= 2.4)

The models are Shardwise's (models/gpt2.cpp, models/llama.cpp), parameter for parameter:
  gpt2   L12 d768 H12, T 1024, learned positions, LayerNorm with bias, GELU (tanh), biases on
         every linear, embedding tied to the LM head. Vocabulary 50304: GPT-2's 50257 padded to
         a multiple of 128 (as nanoGPT and llm.c do; Shardwise trains the same 50304 rows), so
         N = 124.5M with the padding (124.4M without).
  llama  L24 d2048 H16, KV heads 16 (--kv-heads 8 for grouped-query attention), SwiGLU d_ff
         5632, RMSNorm, RoPE (theta 10000, rotate-half as Hugging Face), vocab 32000, T 2048,
         untied LM head, no biases: N = 1.364B.
A step: zero_grad, forward under bf16 autocast (parameters and AdamW state stay fp32: the
master weights), F.scaled_dot_product_attention(is_causal=True), cross-entropy in fp32,
backward, global-norm clipping at 1.0 (as Shardwise's default gradient_clipping), AdamW
(lr 3e-4, betas 0.9/0.95, weight decay 0.1; fused=True on CUDA, the fastest PyTorch has:
reported as "adamw"). Each step's batch is fresh random tokens copied from pinned host memory,
as a data loader would hand them over. --mode compile wraps the model in torch.compile(model)
(the optimizer step stays eager; the fused AdamW is one kernel set already).
Timing: --warmup steps (compile happens in the first), then --steps timed steps, each bracketed
by torch.cuda.synchronize() (--sync) or all of them by one pair (--no-sync); tokens_per_s =
batch * T / step time (the median with --sync; tokens_per_s_mean: over the sum of the steps). MFU = tokens/s * (6 N + 12 L d T) / peak, with peak = 989e12
(H100 SXM dense bf16; the H200 has the same tensor cores and clock, so the same peak).
Where torch.compile is missing (Debian's torch 1.13) --mode compile prints status
"unavailable" and exits 0; a compile error prints status "failed", an out-of-memory status
"oom" (exit 1 for both), so the harness always gets one JSON line.
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {  # name: (vocab, layers, d, heads, kv_heads, d_ff, T, default batch)
    "gpt2": dict(vocab=50304, layers=12, d=768, heads=12, kv_heads=12, d_ff=3072, T=1024, batch=16),
    "llama": dict(vocab=32000, layers=24, d=2048, heads=16, kv_heads=16, d_ff=5632, T=2048, batch=4),
}
TINY = {  # --tiny: a few seconds on a CPU, every code path the same
    "gpt2": dict(vocab=256, layers=2, d=64, heads=4, kv_heads=4, d_ff=256, T=64, batch=4),
    "llama": dict(vocab=256, layers=2, d=64, heads=4, kv_heads=2, d_ff=192, T=64, batch=4),
}
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")
SDPA_BACKENDS_ALL = ("cudnn", "flash", "efficient", "math")  # --sdpa-backend's names
try:  # torch >= 2.3: a context that forces SDPA's backend
    from torch.nn.attention import SDPBackend, sdpa_kernel
    SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                     "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
except ImportError:
    sdpa_kernel, SDPA_BACKENDS = None, {}


def sdpa_context(name):
    """A context that forces SDPA backend `name` ("default" or None: PyTorch's own dispatch)."""
    if name in (None, "default") or sdpa_kernel is None:
        return contextlib.nullcontext()
    return sdpa_kernel([SDPA_BACKENDS[name]])


def sync_device(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_sdpa_backends(dev, B, H, T, hd, dtype, reps=5, passes=2):
    """Seconds per causal SDPA forward + backward on (B, H, T, hd) per backend (the best of
    `passes` passes over the backends, so that the first one's warm-up does not count against
    it), and the errors of those that cannot run the shape here (left out)."""
    times, errors = {}, {}
    for name in [n for _ in range(passes) for n in SDPA_BACKENDS]:
        if name in errors:
            continue
        try:
            q, k, v = (torch.randn(B, H, T, hd, device=dev, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            g = torch.randn(B, H, T, hd, device=dev, dtype=dtype)

            def once():
                with sdpa_context(name):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                o.backward(g)

            once()
            once()
            sync_device(dev)
            t0 = time.perf_counter()
            for _ in range(reps):
                once()
            sync_device(dev)
            t = (time.perf_counter() - t0) / reps
            times[name] = min(t, times.get(name, t))
        except Exception as e:  # noqa: BLE001 -- "no kernel for this shape/device" and the like
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            errors[name] = f"{type(e).__name__}: {msg}"[:200]
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return times, errors


def attention(q, k, v):
    """(B, H, T, hd) causal attention; K/V with fewer heads are repeated (GQA)."""
    if k.size(1) != q.size(1):
        rep = q.size(1) // k.size(1)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    if HAVE_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(-2)  # torch < 2.0 (the CPU smoke test only)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~mask, float("-inf"))
    return F.softmax(att.float(), dim=-1).to(v.dtype) @ v


class GPT2Block(nn.Module):
    def __init__(self, s):
        super().__init__()
        d = s["d"]
        self.h = s["heads"]
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, s["d_ff"])
        self.mlp_proj = nn.Linear(s["d_ff"], d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.wte = nn.Embedding(s["vocab"], s["d"])
        self.wpe = nn.Embedding(s["T"], s["d"])
        self.blocks = nn.ModuleList([GPT2Block(s) for _ in range(s["layers"])])
        self.ln_f = nn.LayerNorm(s["d"])
        res_std = 0.02 / math.sqrt(2 * s["layers"])
        for name, p in self.named_parameters():  # Shardwise's initialisation (models/gpt2.cpp)
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, 0.0, res_std if name.endswith("proj.weight") else 0.02)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied head


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        if hasattr(F, "rms_norm"):  # torch >= 2.4
            return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, s, fused_proj=False):
        super().__init__()
        d, H, KV = s["d"], s["heads"], s["kv_heads"]
        self.H, self.KV, self.hd, self.fused = H, KV, d // H, fused_proj
        self.input_layernorm = RMSNorm(d)
        if fused_proj:  # q|k|v and gate|up as one product each (the same parameters stacked)
            self.qkv_proj = nn.Linear(d, (H + 2 * KV) * self.hd, bias=False)
            self.gate_up_proj = nn.Linear(d, 2 * s["d_ff"], bias=False)
        else:
            self.q_proj = nn.Linear(d, H * self.hd, bias=False)
            self.k_proj = nn.Linear(d, KV * self.hd, bias=False)
            self.v_proj = nn.Linear(d, KV * self.hd, bias=False)
            self.gate_proj = nn.Linear(d, s["d_ff"], bias=False)
            self.up_proj = nn.Linear(d, s["d_ff"], bias=False)
        self.o_proj = nn.Linear(H * self.hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.down_proj = nn.Linear(s["d_ff"], d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        if self.fused:
            q, k, v = self.qkv_proj(h).split(
                [self.H * self.hd, self.KV * self.hd, self.KV * self.hd], dim=2)
        else:
            q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        q = q.view(B, T, self.H, self.hd).transpose(1, 2)
        k = k.view(B, T, self.KV, self.hd).transpose(1, 2)
        v = v.view(B, T, self.KV, self.hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # bf16 under autocast, as q and k
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = attention(q, k, v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        if self.fused:
            g, u = self.gate_up_proj(h).chunk(2, dim=-1)
        else:
            g, u = self.gate_proj(h), self.up_proj(h)
        return x + self.down_proj(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self, s, theta=10000.0, fused_proj=False):
        super().__init__()
        self.embed_tokens = nn.Embedding(s["vocab"], s["d"])
        self.layers = nn.ModuleList([LlamaBlock(s, fused_proj) for _ in range(s["layers"])])
        self.norm = RMSNorm(s["d"])
        self.lm_head = nn.Linear(s["d"], s["vocab"], bias=False)
        hd = s["d"] // s["heads"]
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(s["T"]).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)  # (T, hd)
        self.register_buffer("cos", ang.cos()[None, None], persistent=False)
        self.register_buffer("sin", ang.sin()[None, None], persistent=False)
        res_std = 0.02 / math.sqrt(2 * s["layers"])
        for name, p in self.named_parameters():  # Shardwise's initialisation (models/llama.cpp)
            if p.dim() == 1:
                nn.init.ones_(p)
            else:
                std = res_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:, :, :T], self.sin[:, :, :T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def param_count(model, s):
    """N from the shape alone, as models/gpt2.cpp and models/llama.cpp declare the parameters
    (the harness uses it for Shardwise's MFU; main() checks it against the PyTorch model)."""
    V, L, d, F_, T = s["vocab"], s["layers"], s["d"], s["d_ff"], s["T"]
    if model == "gpt2":  # wte (tied head), wpe, ln_f; per block 2 LayerNorms, 4 linears with bias
        return V * d + T * d + 2 * d + L * (4 * d + 3 * d * d + 3 * d + d * d + d + 2 * d * F_ + F_ + d)
    hd = d // s["heads"]  # llama: embedding, untied head, final RMSNorm; per block 2 RMSNorms
    return 2 * V * d + d + L * (2 * d + 2 * d * s["heads"] * hd + 2 * d * s["kv_heads"] * hd + 3 * d * F_)


def flops_per_token(n_params, s):
    """The issue's count: 6 N (forward and backward of every weight) + 12 L d T (attention)."""
    return 6 * n_params + 12 * s["layers"] * s["d"] * s["T"]


def emit(rec):
    print(json.dumps(rec), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="gpt2")
    ap.add_argument("--mode", choices=["eager", "compile"], default="compile")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU smoke test)")
    ap.add_argument("--batch", type=int, default=0, help="micro-batch rows (0: the model's default)")
    ap.add_argument("--T", type=int, default=0, help="sequence length (0: the model's)")
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: KV heads (0: the model's)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile in the first)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="autocast dtype")
    ap.add_argument("--peak-flops", type=float, default=989e12,
                    help="peak FLOP/s for MFU (989e12: H100/H200 SXM dense bf16)")
    ap.add_argument("--fused-adamw", action=argparse.BooleanOptionalAction, default=True,
                    help="AdamW(fused=True) (--no-fused-adamw: foreach)")
    ap.add_argument("--plain", action="store_true",
                    help="the plain user's peer (the figure before issue 39): no --compile-loss, "
                         "--sdpa-backend default, no --fused-proj, --sync")
    ap.add_argument("--compile-loss", action=argparse.BooleanOptionalAction, default=None,
                    help="the loss inside the compiled graph (tuned default)")
    ap.add_argument("--sdpa-backend", choices=["auto", "default", *SDPA_BACKENDS_ALL], default=None,
                    help="auto (tuned default): the fastest by timing; default: PyTorch's dispatch")
    ap.add_argument("--fused-proj", action=argparse.BooleanOptionalAction, default=None,
                    help="llama: q|k|v and gate|up as one Linear each (tuned default)")
    ap.add_argument("--no-sync", dest="sync", action="store_false", default=None,
                    help="no host synchronisation inside the timed window (tuned default)")
    ap.add_argument("--sync", dest="sync", action="store_true",
                    help="synchronise around every step (the plain peer)")
    ap.add_argument("--clip", type=float, default=1.0, help="global-norm clipping (0: off)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--shape-only", action="store_true",
                    help="print the shape, N and FLOPs per token as JSON and exit (no model built)")
    a = ap.parse_args()
    # Unset tuning flags take the tuned value, or the plain one with --plain.
    tuned = not a.plain
    if a.compile_loss is None:
        a.compile_loss = tuned
    if a.sdpa_backend is None:
        a.sdpa_backend = "auto" if tuned else "default"
    if a.fused_proj is None:
        a.fused_proj = tuned
    if a.sync is None:
        a.sync = not tuned

    s = dict((TINY if a.tiny else SHAPES)[a.model])
    if a.T:
        s["T"] = a.T
    if a.kv_heads:
        s["kv_heads"] = a.kv_heads
    B = a.batch or s["batch"]
    T = s["T"]
    if a.shape_only:
        n = param_count(a.model, s)
        emit({"model": a.model, "tiny": a.tiny, **s, "batch": B, "params": n,
              "flops_per_token": flops_per_token(n, s)})
        return 0
    dev = torch.device(a.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)  # torch.cuda.set_device needs an index (torch 2.11)
    rec = {"engine": "pytorch", "torch": torch.__version__, "model": a.model, "tiny": a.tiny,
           "mode": a.mode, "device": str(dev), "dtype": a.dtype, "batch": B, "T": T,
           "layers": s["layers"], "d_model": s["d"], "heads": s["heads"],
           "kv_heads": s["kv_heads"], "d_ff": s["d_ff"], "vocab": s["vocab"]}
    if dev.type == "cuda":
        rec["gpu"] = torch.cuda.get_device_name(dev) if torch.cuda.is_available() else None
        if not torch.cuda.is_available():
            emit({**rec, "status": "failed", "error": "torch.cuda.is_available() is False"})
            return 1
    if a.mode == "compile" and not hasattr(torch, "compile"):
        emit({**rec, "status": "unavailable",
              "error": f"torch {torch.__version__} has no torch.compile"})
        return 0
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 stays fp32 (Shardwise: no TF32)

    model = (GPT2(s) if a.model == "gpt2" else Llama(s, fused_proj=a.fused_proj)).to(dev)
    n_params = sum(p.numel() for p in model.parameters())  # tied weights count once
    if n_params != param_count(a.model, s):
        print(f"torch_gpu_step: warning: {n_params} parameters, the formula says "
              f"{param_count(a.model, s)}", file=sys.stderr)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    fused = a.fused_adamw
    try:
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                **({"fused": True} if fused else {}))
    except (RuntimeError, TypeError, ValueError):  # no fused AdamW on this device / torch
        fused = False
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    # The attention backend: timed on the model's attention shape (GQA's K/V are repeated to
    # H heads before SDPA), then forced for the whole run.
    backend, sdpa_times = a.sdpa_backend, None
    if backend == "auto":
        if HAVE_SDPA and SDPA_BACKENDS:
            dt_att = torch.bfloat16 if a.dtype == "bf16" else torch.float32
            sdpa_times, sdpa_err = time_sdpa_backends(dev, B, s["heads"], T, s["d"] // s["heads"],
                                                      dt_att)
            backend = min(sdpa_times, key=sdpa_times.get) if sdpa_times else "default"
            rec["sdpa_times_s"] = {k: round(v, 6) for k, v in sdpa_times.items()}
            if sdpa_err:
                rec["sdpa_refused"] = sdpa_err
        else:
            backend = "default"
    elif backend != "default" and not SDPA_BACKENDS:
        emit({**rec, "status": "unavailable",
              "error": f"torch {torch.__version__} cannot force an SDPA backend"})
        return 0
    rec.update(params=n_params, adamw="fused" if fused else "default",
               attention="sdpa" if HAVE_SDPA else "manual", sdpa_backend=backend,
               tuned=tuned, compile_loss=a.compile_loss and a.mode == "compile",
               fused_proj=a.fused_proj and a.model == "llama", sync_each_step=a.sync,
               flops_per_token=flops_per_token(n_params, s), peak_flops=a.peak_flops)

    def forward_loss(idx, tgt):  # the loss in the same function as the model: one graph
        logits = model(idx)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.reshape(-1))

    compiled = a.mode == "compile"
    step_model = torch.compile(model) if compiled and not a.compile_loss else model
    step_loss = torch.compile(forward_loss) if compiled and a.compile_loss else None

    pin = dev.type == "cuda"
    gen = torch.Generator().manual_seed(1)

    def batch():
        x = torch.randint(0, s["vocab"], (B, T + 1), generator=gen, dtype=torch.int64)
        if pin:
            x = x.pin_memory()
        x = x.to(dev, non_blocking=True)
        return x[:, :-1], x[:, 1:]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def step():
        idx, tgt = batch()
        opt.zero_grad(set_to_none=True)
        with sdpa_context(backend):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                if step_loss is not None:
                    loss = step_loss(idx, tgt)
                else:
                    logits = step_model(idx)
            if step_loss is None:
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.reshape(-1))
            loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        return loss

    times = []
    span = None  # --no-sync: the timed steps' span, from one synchronisation to the next
    t_start = time.perf_counter()
    try:
        for i in range(a.warmup + a.steps):
            timed = i >= a.warmup
            if a.sync or i <= a.warmup:  # (--no-sync: once, before the first timed step)
                sync()
            t0 = time.perf_counter()
            if timed and span is None:
                span = t0
            loss = step()
            if a.sync or not timed:
                sync()
            dt = time.perf_counter() - t0
            if i == 0:
                rec["first_step_s"] = dt  # includes compilation in compile mode
            print(f"step {i + 1}{' (warm-up)' if i < a.warmup else ''}: {dt:.4f} s"
                  f"{'' if a.sync or not timed else ' (issued; not synchronised)'}",
                  file=sys.stderr, flush=True)  # the log shows how far a run that is stopped got
            if timed:
                times.append(dt)
        sync()
        if not a.sync and times:  # the device's time for all timed steps, evenly
            span = time.perf_counter() - span
            times = [span / len(times)] * len(times)
    except Exception as e:  # noqa: BLE001 -- the harness wants a line, whatever happened
        oom = "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"
        emit({**rec, "status": "oom" if oom else "failed",
              "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300],
              "steps_done": len(times)})
        return 1
    med = statistics.median(times)
    tok_s = B * T / med
    rec.update(status="ok", warmup=a.warmup, steps=a.steps, step_s=med,
               step_s_all=[round(t, 6) for t in times], tokens_per_s=tok_s,
               tokens_per_s_mean=B * T * len(times) / sum(times),
               mfu=tok_s * rec["flops_per_token"] / a.peak_flops, loss=float(loss),
               wall_s=time.perf_counter() - t_start,
               max_mem_allocated_bytes=(torch.cuda.max_memory_allocated(dev)
                                        if dev.type == "cuda" else None))
    emit(rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
