"""The peer of bench_cuda_gemm: PyTorch's bf16 products for the same shapes (row-major,
out = op(A) op(B)), as its linear layers run them under the GPU benchmark (bf16 in, bf16 out),
median of 15 after 3 warm-ups, in TFLOP/s. Run by scripts/gpu_build.sh --test where torch
imports; prints a line and exits 0 without a GPU."""
import sys

try:
    import torch
except ImportError:
    print("torch_gemm: no torch here; nothing measured")
    sys.exit(0)
if not torch.cuda.is_available():
    print("torch_gemm: no GPU here; nothing measured")
    sys.exit(0)


def shapes():
    out = []

    def linear(model, name, n, c, oc):
        out.append((model, name + " fwd", False, True, n, oc, c))
        out.append((model, name + " dinp", False, False, n, c, oc))
        out.append((model, name + " dw", True, False, oc, c, n))

    nl, d, f = 8192, 2048, 5632
    linear("llama", "qkv", nl, d, 3 * d)
    linear("llama", "o", nl, d, d)
    linear("llama", "gate_up", nl, d, 2 * f)
    linear("llama", "down", nl, f, d)
    linear("llama", "lm_head chunk", 1024, d, 32000)
    linear("llama", "lm_head 2048 rows", 2048, d, 32000)
    linear("llama", "lm_head 4096 rows", 4096, d, 32000)
    ng, g, gf = 16384, 768, 3072
    linear("gpt2", "qkv", ng, g, 3 * g)
    linear("gpt2", "proj", ng, g, g)
    linear("gpt2", "fc", ng, g, gf)
    linear("gpt2", "fcproj", ng, gf, g)
    linear("gpt2", "lm_head chunk", 1024, g, 50304)
    return out


def median_ms(fn):
    for _ in range(3):
        fn()
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    print(f"torch_gemm: {torch.cuda.get_device_name()}, torch {torch.__version__}; TFLOP/s")
    print(f"{'model':8} {'product':22} {'M':>6} {'N':>6} {'K':>6} {'bf16_out':>9} {'f32_out':>9}")
    for model, name, ta, tb, m, n, k in shapes():
        a = torch.randn((k, m) if ta else (m, k), device="cuda", dtype=torch.bfloat16)
        b = torch.randn((n, k) if tb else (k, n), device="cuda", dtype=torch.bfloat16)
        aa = a.t() if ta else a
        bb = b.t() if tb else b
        flop = 2.0 * m * n * k
        t16 = median_ms(lambda: torch.mm(aa, bb))
        c32 = torch.empty((m, n), device="cuda", dtype=torch.float32)
        try:  # fp32 output from bf16 operands (torch >= 2.6 takes out_dtype)
            t32 = median_ms(lambda: torch.mm(aa, bb, out_dtype=torch.float32, out=c32))
            f32 = f"{flop / t32 / 1e9:9.1f}"
        except (TypeError, RuntimeError):
            f32 = f"{'n/a':>9}"
        print(f"{model:8} {name:22} {m:6d} {n:6d} {k:6d} {flop / t16 / 1e9:9.1f} {f32}")


main()
