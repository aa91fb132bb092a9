#!/usr/bin/python3
"""Independent reference for the model tests: tiny GPT-2 and Llama in plain PyTorch ops.

Generates weights, tokens and targets from a seed, runs forward and backward in float64 (with
the float32-rounded weights, so the C++ side sees exactly the same numbers) and writes a
versioned binary:

    magic   8 bytes  b"SWMODREF"
    version u32      1
    count   u32      number of tensors
    count x { name_len u32, name bytes (utf-8), dtype u32 (0 = f32, 1 = i32),
              ndim u32, dims i64 x ndim, data (little-endian, row-major) }

Tensor names: "param.<our name>" (every weight), "grad.<our name>" (d mean loss / d weight),
"tokens" (B,T) i32, "targets" (B,T) i32 (-1 = ignored), "loss" (1) f32 (mean over counted
targets), "logits" (B,V) f32 (last position of each sequence), "meta.config" i32
[V, L, H, KVH, C, F, maxT, B, T].

Usage: torch_ref.py --model gpt2|llama --out FILE [--seed S] [sizes...]
"""
import argparse
import math
import struct
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.stderr.write(
        "torch_ref.py: PyTorch is not installed for %s (install Debian's python3-torch)\n"
        % sys.executable)
    sys.exit(3)

MAGIC = b"SWMODREF"
VERSION = 1


def write_tensors(path, tensors):
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<II", VERSION, len(tensors)))
        for name, t in tensors:
            t = t.detach().contiguous().cpu()
            if t.dtype in (torch.int32, torch.int64):
                code, t = 1, t.to(torch.int32)
            else:
                code, t = 0, t.to(torch.float32)
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<II", code, t.dim()))
            f.write(struct.pack("<%dq" % t.dim(), *t.shape))
            f.write(t.numpy().astype("<i4" if code else "<f4").tobytes())


class Weights:
    """Named parameters in declaration order, float32-rounded then float64 leaves."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.names, self.t = [], {}

    def add(self, name, shape, kind, std=0.0):
        z = torch.randn(*shape, generator=self.g, dtype=torch.float64)
        if kind == "normal":
            v = std * z
        elif kind == "ones":
            v = 1.0 + 0.1 * z
        else:  # small non-zero biases so every path carries signal
            v = 0.05 * z
        v = v.to(torch.float32).to(torch.float64).requires_grad_(True)
        self.names.append(name)
        self.t[name] = v
        return v

    def __getitem__(self, name):
        return self.t[name]


def causal_attention(q, k, v):
    # q (B,H,T,hd), k/v (B,H,T,hd) -> (B,H,T,hd)
    T, hd = q.shape[2], q.shape[3]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = att.masked_fill(mask, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gpt2(a, W, tokens):
    B, T = tokens.shape
    C, H, L = a.C, a.H, a.L
    hd = C // H
    x = W["wte"][tokens.long()] + W["wpe"][:T]
    for l in range(L):
        p = "h.%d." % l
        h = layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"])
        qkv = h @ W[p + "attn.c_attn.weight"].T + W[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = [t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v)]
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ W[p + "attn.c_proj.weight"].T + W[p + "attn.c_proj.bias"]
        h = layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"])
        h = gelu_tanh(h @ W[p + "mlp.c_fc.weight"].T + W[p + "mlp.c_fc.bias"])
        x = x + h @ W[p + "mlp.c_proj.weight"].T + W[p + "mlp.c_proj.bias"]
    h = layer_norm(x, W["ln_f.weight"], W["ln_f.bias"])
    head = W["wte"] if a.tied else W["lm_head.weight"]
    return h @ head.T


def gpt2_weights(a):
    W = Weights(a.seed)
    C, F_, V, std = a.C, a.F, a.V, a.std
    W.add("wte", (V, C), "normal", std)
    W.add("wpe", (a.maxT, C), "normal", std)
    W.add("ln_f.weight", (C,), "ones")
    W.add("ln_f.bias", (C,), "zeros")
    if not a.tied:
        W.add("lm_head.weight", (V, C), "normal", std)
    for l in range(a.L):
        p = "h.%d." % l
        W.add(p + "ln_1.weight", (C,), "ones")
        W.add(p + "ln_1.bias", (C,), "zeros")
        W.add(p + "attn.c_attn.weight", (3 * C, C), "normal", std)
        W.add(p + "attn.c_attn.bias", (3 * C,), "zeros")
        W.add(p + "attn.c_proj.weight", (C, C), "normal", std)
        W.add(p + "attn.c_proj.bias", (C,), "zeros")
        W.add(p + "ln_2.weight", (C,), "ones")
        W.add(p + "ln_2.bias", (C,), "zeros")
        W.add(p + "mlp.c_fc.weight", (F_, C), "normal", std)
        W.add(p + "mlp.c_fc.bias", (F_,), "zeros")
        W.add(p + "mlp.c_proj.weight", (C, F_), "normal", std)
        W.add(p + "mlp.c_proj.bias", (C,), "zeros")
    return W


def llama3_scaled(inv, factor, low, high, orig):
    # Llama 3.1's frequencies (transformers' _compute_llama3_parameters), in float64.
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return torch.where(medium, blended, scaled)


def rope(x, theta, scaling=None):
    # x (B,h,T,hd); Hugging Face rotate_half: dim i pairs with i + hd/2; position of row t is t.
    T, hd = x.shape[2], x.shape[3]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if scaling:
        inv = llama3_scaled(inv, *scaling)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def llama(a, W, tokens):
    B, T = tokens.shape
    C, H, KVH, L = a.C, a.H, a.KVH, a.L
    hd = C // H
    x = W["embed_tokens.weight"][tokens.long()]
    for l in range(L):
        p = "layers.%d." % l
        h = rms_norm(x, W[p + "input_layernorm.weight"], a.eps)
        q, k, v = [h @ W[p + "self_attn.%s_proj.weight" % n].T for n in "qkv"]
        if a.qkv_bias:
            q, k, v = [t + W[p + "self_attn.%s_proj.bias" % n] for t, n in zip((q, k, v), "qkv")]
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, KVH, hd).transpose(1, 2)
        v = v.view(B, T, KVH, hd).transpose(1, 2)
        q, k = rope(q, a.theta, a.llama3), rope(k, a.theta, a.llama3)
        rep = H // KVH  # query head j uses key/value head j // rep (HF repeat_kv)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + y @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], a.eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    h = rms_norm(x, W["norm.weight"], a.eps)
    return h @ (W["embed_tokens.weight"] if a.tied else W["lm_head.weight"]).T


def llama_weights(a):
    W = Weights(a.seed)
    C, H, KVH, F_, V, std = a.C, a.H, a.KVH, a.F, a.V, a.std
    hd = C // H
    W.add("embed_tokens.weight", (V, C), "normal", std)
    for l in range(a.L):
        p = "layers.%d." % l
        W.add(p + "input_layernorm.weight", (C,), "ones")
        W.add(p + "self_attn.q_proj.weight", (H * hd, C), "normal", std)
        W.add(p + "self_attn.k_proj.weight", (KVH * hd, C), "normal", std)
        W.add(p + "self_attn.v_proj.weight", (KVH * hd, C), "normal", std)
        W.add(p + "self_attn.o_proj.weight", (C, H * hd), "normal", std)
        W.add(p + "post_attention_layernorm.weight", (C,), "ones")
        W.add(p + "mlp.gate_proj.weight", (F_, C), "normal", std)
        W.add(p + "mlp.up_proj.weight", (F_, C), "normal", std)
        W.add(p + "mlp.down_proj.weight", (C, F_), "normal", std)
        if a.qkv_bias:
            for n, oc in (("q", H * hd), ("k", KVH * hd), ("v", KVH * hd)):
                W.add(p + "self_attn.%s_proj.bias" % n, (oc,), "normal", std)
    W.add("norm.weight", (C,), "ones")
    if not a.tied:
        W.add("lm_head.weight", (V, C), "normal", std)
    return W


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["gpt2", "llama"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--V", type=int, default=40)
    ap.add_argument("--L", type=int, default=2)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--KVH", type=int, default=0)
    ap.add_argument("--C", type=int, default=32)
    ap.add_argument("--F", type=int, default=0)
    ap.add_argument("--maxT", type=int, default=16)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=8)
    ap.add_argument("--theta", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--std", type=float, default=0.2)
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--qkv-bias", action="store_true")  # llama: Qwen2's q, k, v biases
    # llama: RoPE scaling "llama3" as FACTOR,LOW_FREQ_FACTOR,HIGH_FREQ_FACTOR,ORIGINAL_MAX_POS
    ap.add_argument("--llama3", default="")
    a = ap.parse_args()
    a.llama3 = [float(x) for x in a.llama3.split(",")] if a.llama3 else None
    a.KVH = a.KVH or a.H
    a.F = a.F or 4 * a.C
    a.tied = not a.untied
    # eps is a float32 in the C++ config: use the same value.
    a.eps = float(torch.tensor(a.eps, dtype=torch.float32))
    a.theta = float(torch.tensor(a.theta, dtype=torch.float32))

    W = gpt2_weights(a) if a.model == "gpt2" else llama_weights(a)
    g = torch.Generator().manual_seed(a.seed + 1000)
    tokens = torch.randint(0, a.V, (a.B, a.T), generator=g, dtype=torch.int64)
    targets = torch.randint(0, a.V, (a.B, a.T), generator=g, dtype=torch.int64)
    targets.view(-1)[3::5] = -1  # some ignored positions

    logits = (gpt2 if a.model == "gpt2" else llama)(a, W, tokens)  # (B,T,V)
    loss = F.cross_entropy(logits.reshape(-1, a.V), targets.reshape(-1), ignore_index=-1)
    loss.backward()

    out = [("meta.config", torch.tensor([a.V, a.L, a.H, a.KVH, a.C, a.F, a.maxT, a.B, a.T]))]
    out += [("tokens", tokens), ("targets", targets)]
    out += [("param." + n, W[n]) for n in W.names]
    out += [("loss", loss.reshape(1)), ("logits", logits[:, -1, :])]
    out += [("grad." + n, W[n].grad) for n in W.names]
    write_tensors(a.out, out)


if __name__ == "__main__":
    main()
