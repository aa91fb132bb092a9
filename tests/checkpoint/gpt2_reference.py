"""PyTorch reference for exported GPT-2 weights (test_ckpt_reference.cpp).

Usage: gpt2_reference.py MODEL.safetensors BATCH.bin EXPECTED_LOSS

Reads the safetensors file with a small reader of its own (json + struct; the `safetensors`
package is not needed), builds GPT-2 in PyTorch from the file's model_config metadata with
Hugging Face's layout (Conv1D weights are (in, out): y = x @ W + b; the LM head is wte), runs
the batch (BATCH.bin: int32 B, T, then B*T tokens and B*T targets, -1 = ignored) and compares
the mean cross-entropy with Shardwise's. Exit 0 when within 1e-4 relative, 1 otherwise.
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    meta = header.pop("__metadata__", {})
    data = raw[8 + hlen:]
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        assert 0 <= b <= e <= len(data), (name, b, e)
        shape = info["shape"]
        n = math.prod(shape)
        assert e - b == 4 * n, (name, shape, b, e)
        t = torch.frombuffer(bytearray(data[b:e]), dtype=torch.float32) if n else torch.zeros(0)
        tensors[name] = t.reshape(shape).clone()
    return tensors, meta


def read_batch(path):
    """BATCH.bin: int32 B, T, then B*T tokens and B*T targets. Returns (tokens, targets), (B, T)."""
    with open(path, "rb") as f:
        raw = f.read()
    B, T = struct.unpack("<ii", raw[:8])
    ids = torch.tensor(struct.unpack(f"<{2 * B * T}i", raw[8:8 + 8 * B * T]), dtype=torch.long)
    return ids[:B * T].view(B, T), ids[B * T:].view(B, T)


def gpt2_loss(w, cfg, tokens, targets):
    C, H = cfg["d_model"], cfg["n_head"]
    eps = cfg["norm_eps"]
    B, T = tokens.shape
    x = w["wte.weight"][tokens] + w["wpe.weight"][:T][None]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        s = s.masked_fill(~mask, float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], eps)
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["wte.weight"]
    logits = x @ head.t()
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)


def main():
    path, batch_path, expected = sys.argv[1], sys.argv[2], float(sys.argv[3])
    torch.set_default_dtype(torch.float64)
    w, meta = read_safetensors(path)
    cfg = json.loads(meta["model_config"])
    assert cfg["type"] == "gpt2", cfg
    w = {k: v.double() for k, v in w.items()}  # float64: the reference, not a peer
    tokens, targets = read_batch(batch_path)
    loss = gpt2_loss(w, cfg, tokens, targets).item()
    rel = abs(loss - expected) / abs(loss)
    print(f"pytorch loss {loss:.8f}  shardwise {expected:.8f}  rel diff {rel:.2e}")
    sys.exit(0 if rel <= 1e-4 else 1)


if __name__ == "__main__":
    main()
