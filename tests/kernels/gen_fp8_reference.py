#!/usr/bin/env python3
"""Writes tests/kernels/data/fp8_reference.txt: fp32 inputs and PyTorch's saturating casts of
them to torch.float8_e4m3fn and torch.float8_e5m2 (x.clamp(-max, max).to(dtype), as torchao's
float8 training casts), read back as fp32. test_fp8.cpp compares kernels/fp8_ops.h round_fp8
with it. Run with PyTorch >= 2.1 (here /work/torch215/bin/python); the file is committed, so
the test needs no torch.

Inputs: ties between neighbouring values of each format (normal and subnormal ranges, the
largest binade), values beside them, saturation (the maxima, the halfway points above them,
huge values, infinities), the formats' subnormals and the values that round to zero or to the
smallest subnormal, fp32 subnormals, signed zeros, NaN, and random values over many binades.
One line per input: three fp32 bit patterns in hex (input, e4m3, e5m2)."""
import os
import struct

import torch

def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]

def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]

def format_values(dtype):
    # Every finite value of the format, from its bytes.
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    return sorted(set(v for v in raw.tolist() if v == v and abs(v) != float("inf")))

xs = []
for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
    vals = [v for v in format_values(dtype) if v >= 0]
    for a, b in zip(vals, vals[1:]):
        mid = (a + b) / 2  # exact in fp32 (a few bits)
        xs += [a, b, mid, f32(bits(mid) + 1), f32(bits(mid) - 1) if mid > 0 else 0.0]
    mx = vals[-1]
    step = vals[-1] - vals[-2]
    xs += [mx + step / 2, mx + step / 2 + step / 8, mx + step, mx * 2, 1e30]
    sub = vals[1]  # the smallest subnormal
    xs += [sub / 2, sub / 2 * 1.0001, sub / 4, sub * 1.5, sub * 2.5]
xs += [0.0, -0.0, float("inf"), float("-inf"), float("nan"), f32(1), f32(0x007FFFFF),
       f32(0x00800000), 1e-30, 65504.0, 57344.0, 61440.0, 61439.0, 480.0, 464.0, 463.99]
g = torch.Generator().manual_seed(39)
r = torch.randn(600, generator=g) * torch.exp2(torch.randint(-24, 20, (600,), generator=g).float())
xs += r.tolist()
xs = xs + [-x for x in xs]

x = torch.tensor(xs, dtype=torch.float32)
out = []
for dtype, mx in ((torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)):
    out.append(x.clamp(-mx, mx).to(dtype).float())
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "fp8_reference.txt")
with open(path, "w") as f:
    f.write("# gen_fp8_reference.py, torch %s: input e4m3fn e5m2 (fp32 bits, hex)\n"
            % torch.__version__)
    for i in range(len(xs)):
        f.write("%08x %08x %08x\n" % (bits(x[i].item()), bits(out[0][i].item()),
                                       bits(out[1][i].item())))
print(path, len(xs))
