#!/usr/bin/env python3
"""PyTorch peer for bench_step: one GPT-2-style training step (forward, backward, AdamW) on the
same shapes, fp32 or bf16 autocast, single process. Prints one JSON line.

Run with Debian's torch: /usr/bin/python3 bench/torch_step.py --threads 2 ...
Set OMP_WAIT_POLICY=PASSIVE in the environment: without it PyTorch's OpenMP and OpenBLAS
threads fight over 2 cores (the figure drops by about a fifth).

The plain peer (the default, as every earlier figure) runs eager with the attention written
out (masked softmax). --tuned is the issue-39 peer: torch.compile of the whole model with the
loss inside the compiled graph (--mode compile) and AdamW(fused=True) (--fused-adamw); each can
be set alone. Its attention stays written out, which inductor fuses: on the Zen 5 VM (torch
2.15, the small bf16 model of bench/results/bf16_small_2026-11-29.md) that ran at 1.2-1.4x the
compiled model with F.scaled_dot_product_attention (--attention sdpa, CPU flash kernel). Where torch.compile or SDPA is missing (Debian's
torch 1.13) the JSON line says status "unavailable" and the script exits 0."""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        if mask is None:  # --attention sdpa
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, T, sdpa=False):
        super().__init__()
        self.sdpa = sdpa
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(T, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        for name, p in self.named_parameters():  # GPT-2 initialisation, as Shardwise uses
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, None if self.sdpa else self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def add_shape_args(ap, threads):
    """bench_step's shape and run flags (the same names and defaults); also used by torch_ddp.py."""
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=threads)


def main():
    ap = argparse.ArgumentParser()
    add_shape_args(ap, threads=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager",
                    help="compile: torch.compile of the model with the loss inside")
    ap.add_argument("--attention", choices=["manual", "sdpa"], default="manual",
                    help="manual: masked softmax written out; sdpa: F.scaled_dot_product_attention")
    ap.add_argument("--fused-adamw", action="store_true",
                    help="AdamW(fused=True): one kernel set on the CPU too (torch >= 2.4)")
    ap.add_argument("--tuned", action="store_true",
                    help="--mode compile --fused-adamw (attention as --attention says: manual, "
                         "the faster one compiled on the CPU)")
    a = ap.parse_args()
    if a.tuned:
        a.mode, a.fused_adamw = "compile", True
    rec = {"peer": "pytorch " + torch.__version__, "dtype": a.dtype, "threads": a.threads,
           "mode": a.mode, "attention": a.attention,
           "adamw": "fused" if a.fused_adamw else "default"}
    missing = ("torch.compile" if a.mode == "compile" and not hasattr(torch, "compile") else
               "F.scaled_dot_product_attention"
               if a.attention == "sdpa" and not hasattr(F, "scaled_dot_product_attention") else None)
    if missing:
        print(json.dumps({**rec, "status": "unavailable",
                          "error": f"torch {torch.__version__} has no {missing}"}))
        return
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = GPT(a.vocab, a.d, a.layers, a.heads, a.T, sdpa=a.attention == "sdpa")
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1,
                                **({"fused": True} if a.fused_adamw else {}))
    except (RuntimeError, TypeError, ValueError):  # torch < 2.4: no fused AdamW on the CPU
        rec["adamw"] = "default"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    # The loss is computed inside GPT.forward, so the compiled graph holds it (the issue's
    # tuned peer); the optimizer step stays eager, as in torch_gpu_step.py.
    step_model = torch.compile(model) if a.mode == "compile" else model
    idx = torch.randint(0, a.vocab, (a.B, a.T))
    tgt = torch.randint(0, a.vocab, (a.B, a.T))
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = step_model(idx, tgt)
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({**rec, "status": "ok", "params": n_params, "step_s": med,
                      "tokens_per_s": a.B * a.T / med, "loss": float(loss)}))


if __name__ == "__main__":
    main()
