"""PyTorch reference for exported Llama weights (test_ckpt_reference.cpp).

Usage: llama_reference.py MODEL.safetensors BATCH.bin EXPECTED_LOSS

Reads the safetensors file and the batch with gpt2_reference.py's readers (json + struct),
checks that the file holds exactly the tensors a Hugging Face LlamaForCausalLM with this config
has, under HF's names and (out, in) nn.Linear shapes, and runs a Llama written here in float64
from the file's model_config metadata, following transformers' modeling_llama:
  embed_tokens; per layer x += o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))) with
  n = input_layernorm(x), then x += down_proj(silu(gate_proj(n)) * up_proj(n)) with
  n = post_attention_layernorm(x); model.norm; untied lm_head.
RMSNorm: w * x / sqrt(mean(x^2) + eps). Grouped-query attention as HF's repeat_kv: query head h
reads kv head h // (n_head / n_kv_head). RoPE as HF's rotate_half: dim i pairs with dim
i + hd/2, angle t * rope_theta^(-2i/hd). The batch file is int32 B, T, then B*T tokens and
B*T targets (-1 = ignored); the mean cross-entropy is compared with Shardwise's.

As a check that the comparison can fail, the loss is also computed with three plausible
wrong conventions (interleaved RoPE pairs, kv head h % n_kv_head, no RoPE); each must miss
Shardwise's loss by more than 10x the tolerance (the kv mapping moves this model's loss by only
about 6e-5 relative after training, so 100x failed on one CPU's rounding, while the right
conventions agree to about 1e-8). Exit 0 when all holds, 1 otherwise.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_reference import read_batch, read_safetensors  # noqa: E402

# float64 PyTorch vs Shardwise's fp32 forward: observed relative differences are ~6e-9
# (see test_ckpt_reference.cpp); 1e-6 leaves room for other BLAS / thread counts.
TOL = 1e-6


def expected_shapes(cfg):
    C, H, KVH, Fd, V = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"], cfg["d_ff"], cfg["vocab_size"]
    hd = C // H
    s = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C], "lm_head.weight": [V, C]}
    for i in range(cfg["n_layer"]):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = [C]
        s[p + "self_attn.q_proj.weight"] = [H * hd, C]
        s[p + "self_attn.k_proj.weight"] = [KVH * hd, C]
        s[p + "self_attn.v_proj.weight"] = [KVH * hd, C]
        s[p + "self_attn.o_proj.weight"] = [C, H * hd]
        s[p + "post_attention_layernorm.weight"] = [C]
        s[p + "mlp.gate_proj.weight"] = [Fd, C]
        s[p + "mlp.up_proj.weight"] = [Fd, C]
        s[p + "mlp.down_proj.weight"] = [C, Fd]
    return s


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate_interleaved(x):  # wrong convention (Meta's original pairs 2i, 2i+1), for the check
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def llama_loss(w, cfg, tokens, targets, rope="half", kv_map="hf"):
    C, H, KVH = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"]
    hd, eps, theta = C // H, cfg["norm_eps"], cfg["rope_theta"]
    B, T = tokens.shape
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)  # (hd/2)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None]          # (T, hd/2)
    if rope == "half":
        ang = torch.cat((ang, ang), dim=-1)
        rot = rotate_half
    else:
        ang = ang.repeat_interleave(2, dim=-1)
        rot = rotate_interleaved
    cos, sin = ang.cos(), ang.sin()  # (T, hd)
    rep = H // KVH
    kv_of = [h // rep if kv_map == "hf" else h % KVH for h in range(H)]
    mask = torch.ones(T, T, dtype=torch.bool).tril()

    x = w["model.embed_tokens.weight"][tokens]  # (B, T, C)
    for i in range(cfg["n_layer"]):
        p = f"model.layers.{i}."
        n = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (n @ w[p + "self_attn.q_proj.weight"].t()).view(B, T, H, hd).transpose(1, 2)
        k = (n @ w[p + "self_attn.k_proj.weight"].t()).view(B, T, KVH, hd).transpose(1, 2)
        v = (n @ w[p + "self_attn.v_proj.weight"].t()).view(B, T, KVH, hd).transpose(1, 2)
        if rope != "none":
            q = q * cos + rot(q) * sin
            k = k * cos + rot(k) * sin
        k, v = k[:, kv_of], v[:, kv_of]  # (B, H, T, hd)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        s = s.masked_fill(~mask, float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + a @ w[p + "self_attn.o_proj.weight"].t()
        n = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = F.silu(n @ w[p + "mlp.gate_proj.weight"].t()) * (n @ w[p + "mlp.up_proj.weight"].t())
        x = x + g @ w[p + "mlp.down_proj.weight"].t()
    x = rms_norm(x, w["model.norm.weight"], eps)
    logits = x @ w["lm_head.weight"].t()
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1).item()


def main():
    path, batch_path, expected = sys.argv[1], sys.argv[2], float(sys.argv[3])
    torch.set_default_dtype(torch.float64)
    w, meta = read_safetensors(path)
    cfg = json.loads(meta["model_config"])
    assert cfg["type"] == "llama", cfg
    want = expected_shapes(cfg)
    got = {k: list(v.shape) for k, v in w.items()}
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        print(f"HF layout mismatch: missing {missing} extra {extra} wrong shape "
              f"{[(k, got[k], want[k]) for k in wrong]}")
        sys.exit(1)
    w = {k: v.double() for k, v in w.items()}  # float64: the reference, not a peer
    tokens, targets = read_batch(batch_path)
    loss = llama_loss(w, cfg, tokens, targets)
    rel = abs(loss - expected) / abs(loss)
    print(f"pytorch loss {loss:.10f}  shardwise {expected:.10f}  rel diff {rel:.2e} (tol {TOL:.0e})")
    ok = rel <= TOL
    for rope, kv_map in (("interleaved", "hf"), ("half", "mod"), ("none", "hf")):
        wrong = llama_loss(w, cfg, tokens, targets, rope, kv_map)
        wrel = abs(wrong - expected) / abs(wrong)
        sensitive = wrel > 10 * TOL
        print(f"  wrong convention rope={rope} kv={kv_map}: loss {wrong:.10f} rel diff {wrel:.2e}"
              f"{'' if sensitive else '  <- NOT distinguishable: the test would not catch this'}")
        ok = ok and sensitive
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
