// Peak instruction throughput of one core: AVX-512 fp32 FMA (vfmadd231ps, 32 flops) against
// AVX512-BF16 dot products (vdpbf16ps, 64 flops), 12 independent accumulators each (more than
// latency x ports), so the loop measures issue rate, not latency. The printed ratio is the most
// a bf16 GEMM built on vdpbf16ps can gain over an fp32 one on this CPU (kernels/cpu/gemm_bf16*).
#include <cstdio>
#include <ctime>
static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
#define R12(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)
#define FMA(i) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #i "\n"
#define DP(i) "vdpbf16ps %%zmm30, %%zmm31, %%zmm" #i "\n"
int main() {
  if (!__builtin_cpu_supports("avx512bf16")) {
    std::printf("this CPU has no AVX512-BF16\n");
    return 0;
  }
  const long iters = 20000000;
  for (int rep = 0; rep < 3; rep++) {
    const double t0 = now();
    for (long i = 0; i < iters; i++) __asm__ volatile(R12(FMA)::: "memory");
    const double t1 = now();
    for (long i = 0; i < iters; i++) __asm__ volatile(R12(DP)::: "memory");
    const double t2 = now();
    const double fma = iters * 12 / (t1 - t0), dp = iters * 12 / (t2 - t1);
    std::printf("fp32 FMA %.2f G instr/s = %.1f GFLOP/s | vdpbf16ps %.2f G instr/s = %.1f GFLOP/s "
                "| bf16/fp32 flop ratio %.2f\n",
                fma / 1e9, fma * 32 / 1e9, dp / 1e9, dp * 64 / 1e9, dp * 64 / (fma * 32));
  }
}
