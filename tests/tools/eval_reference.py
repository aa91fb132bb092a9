"""PyTorch reference for `shardwise eval` (test_eval_reference.cpp).

Usage: eval_reference.py WEIGHTS.safetensors TOKENS.bin T N_LAYER N_HEAD D_MODEL EPS LOSS COUNT

Reads the token file (llm.c header; version 1 uint16 ids, version 2 int32 ids) and the mask
file beside it when there is one (TOKENS.mask: its own 256-int header, then one byte per
token), cuts the tokens into consecutive windows of T targets (the last one shorter, run as a
shorter sequence, without padding), and sums float64 PyTorch GPT-2 cross-entropies over the
targets whose mask byte is 1 (tests/checkpoint/gpt2_reference.py's model, HF names with or
without `transformer.`). Exit 0 when the count equals COUNT and the mean is within 1e-4
relative of LOSS.
"""
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "checkpoint"))
from gpt2_reference import gpt2_loss, read_safetensors  # noqa: E402


def read_tokens(path):
    with open(path, "rb") as f:
        raw = f.read()
    h = struct.unpack("<256i", raw[:1024])
    assert h[0] == 20240520 and h[1] in (1, 2), h[:3]
    n = h[2]
    fmt = "H" if h[1] == 1 else "i"
    return list(struct.unpack(f"<{n}{fmt}", raw[1024:])), n


def read_mask(path, n):
    if not os.path.exists(path):
        return [1] * n
    with open(path, "rb") as f:
        raw = f.read()
    h = struct.unpack("<256i", raw[:1024])
    assert h[0] == 20261129 and h[1] == 1 and h[2] == n, h[:3]
    return list(raw[1024:])


def main():
    wpath, tpath = sys.argv[1], sys.argv[2]
    T, L, H, C = (int(x) for x in sys.argv[3:7])
    eps, expected, count = float(sys.argv[7]), float(sys.argv[8]), int(sys.argv[9])
    torch.set_default_dtype(torch.float64)
    w, _ = read_safetensors(wpath)
    w = {(k[len("transformer."):] if k.startswith("transformer.") else k): v.double()
         for k, v in w.items()}
    cfg = {"d_model": C, "n_head": H, "n_layer": L, "norm_eps": eps}
    toks, n = read_tokens(tpath)
    base = tpath[:-4] if tpath.endswith(".bin") else tpath
    mask = read_mask(base + ".mask" if tpath.endswith(".bin") else tpath + ".mask", n)
    total, kept = 0.0, 0
    with torch.no_grad():
        for s in range(0, n - 1, T):
            e = min(s + T, n - 1)  # targets s+1 .. e
            inp = torch.tensor(toks[s:e], dtype=torch.long)[None]
            tg = torch.tensor([toks[i] if mask[i] else -1 for i in range(s + 1, e + 1)],
                              dtype=torch.long)[None]
            k = int((tg >= 0).sum())
            if k == 0:
                continue
            total += gpt2_loss(w, cfg, inp, tg).item() * k
            kept += k
    loss = total / kept
    rel = abs(loss - expected) / abs(loss)
    print(f"pytorch loss {loss:.8f} over {kept} tokens; shardwise {expected:.8f} over {count}; "
          f"rel diff {rel:.2e}")
    sys.exit(0 if kept == count and rel <= 1e-4 else 1)


if __name__ == "__main__":
    main()
