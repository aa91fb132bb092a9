// Micro-benchmark of the memory-bound CPU kernels (kernels/cpu: norm, elementwise, adamw) at
// GPT-2 124M shapes: N = B*T rows (default 1024), C = 768, 4C = 3072.
//
//   bench_kernels_a [N] [iters]
//
// For each op: min and median time per call over `iters` timed calls after 3 warm-up calls, and
// the effective bandwidth = bytes the op must move (each input read once, each output written once,
// read-modify-write outputs counted twice) / time. A parallel copy of the same size is printed
// first as the attainable-bandwidth reference for that working-set size (at N = 1024 the
// tensors are a few MiB, so these are cache, not DRAM, numbers; pass a larger N for DRAM).
// Threads: OMP_NUM_THREADS (default: all cores).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/cpu_kernels.h"

namespace {

struct Timing {
  double min, median;  // seconds per call
};

Timing time_calls(const std::function<void()>& fn, int iters) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> t(iters);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(t.begin(), t.end());
  return {t[0], t[iters / 2]};
}

// GB/s is computed from the minimum time (the least disturbed call: on a shared machine the
// median mostly measures other processes); the median is printed to show the spread.
void report(const char* name, const char* shape, double bytes, Timing t) {
  std::printf("%-14s %-10s %8.1f MB %9.3f ms %9.3f ms %8.1f GB/s\n", name, shape, bytes / 1e6,
              t.min * 1e3, t.median * 1e3, bytes / t.min / 1e9);
}

std::vector<float> randn(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = sw::rng_normal(seed, 0, i);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const int N = argc > 1 ? std::atoi(argv[1]) : 1024;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 50;
  const int C = 768, C4 = 4 * C;
  const size_t NC = size_t(N) * C, NC4 = size_t(N) * C4;
  std::printf("bench_kernels_a: N=%d C=%d threads=%d iters=%d\n", N, C, omp_get_max_threads(),
              iters);
  std::printf("%-14s %-10s %11s %12s %12s %13s\n", "op", "shape", "bytes", "min", "median",
              "GB/s (min)");
  char shape[64], shape4[64];
  std::snprintf(shape, sizeof shape, "%dx%d", N, C);
  std::snprintf(shape4, sizeof shape4, "%dx%d", N, C4);

  // Attainable bandwidth for these working-set sizes: a parallel copy.
  {
    std::vector<float> a = randn(NC, 1), b(NC);
    report("copy (ref)", shape, 8.0 * NC, time_calls([&] { sw::cpu::copy(b.data(), a.data(), NC); }, iters));
    std::vector<float> a4 = randn(NC4, 2), b4(NC4);
    report("copy (ref)", shape4, 8.0 * NC4, time_calls([&] { sw::cpu::copy(b4.data(), a4.data(), NC4); }, iters));
  }

  {  // LayerNorm: fwd reads inp, writes out; bwd reads dout, inp, reads+writes dinp.
    std::vector<float> x = randn(NC, 3), w = randn(C, 4), b = randn(C, 5), out(NC), mean(N),
                       rstd(N), dout = randn(NC, 6), dx(NC, 0.f), dw(C, 0.f), db(C, 0.f);
    report("layernorm fwd", shape, 8.0 * NC, time_calls([&] {
             sw::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                        b.data(), N, C);
           }, iters));
    report("layernorm bwd", shape, 16.0 * NC, time_calls([&] {
             sw::cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(),
                                         w.data(), mean.data(), rstd.data(), N, C);
           }, iters));
    report("rmsnorm fwd", shape, 8.0 * NC, time_calls([&] {
             sw::cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
           }, iters));
    report("rmsnorm bwd", shape, 16.0 * NC, time_calls([&] {
             sw::cpu::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                       rstd.data(), N, C);
           }, iters));
  }

  {  // Residual + norm as a block runs it (x2 = x2 + x in place, then the norm of x2): unfused =
     // residual_forward then the norm (two passes over x2), fused = one call. Bytes counted as
     // for the fused op: read a, b; write res, out (16 bytes per element) for both, so the GB/s
     // ratio is the time ratio.
    std::vector<float> a = randn(NC, 17), x = randn(NC, 18), w = randn(C, 19), b = randn(C, 20),
                       out(NC), mean(N), rstd(N);
    double unf = 0, fus = 0;
    auto row = [&](const char* name, const std::function<void()>& fn) {
      const Timing t = time_calls(fn, iters);
      report(name, shape, 16.0 * NC, t);
      return t.min;
    };
    unf = row("res+ln unfused", [&] {
      sw::cpu::residual_forward(a.data(), a.data(), x.data(), NC);
      sw::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), a.data(), w.data(),
                                 b.data(), N, C);
    });
    fus = row("res+ln fused", [&] {
      sw::cpu::residual_layernorm_forward(a.data(), out.data(), mean.data(), rstd.data(),
                                          a.data(), x.data(), w.data(), b.data(), N, C);
    });
    std::printf("%-14s %-10s fused/unfused speed-up %.2fx\n", "res+ln", shape, unf / fus);
    unf = row("res+rms unfused", [&] {
      sw::cpu::residual_forward(a.data(), a.data(), x.data(), NC);
      sw::cpu::rmsnorm_forward(out.data(), rstd.data(), a.data(), w.data(), N, C, 1e-5f);
    });
    fus = row("res+rms fused", [&] {
      sw::cpu::residual_rmsnorm_forward(a.data(), out.data(), rstd.data(), a.data(), x.data(),
                                        w.data(), N, C, 1e-5f);
    });
    std::printf("%-14s %-10s fused/unfused speed-up %.2fx\n", "res+rms", shape, unf / fus);
  }

  {  // GELU on the (N, 4C) MLP activation; fwd reads inp, writes out; bwd reads inp, dout, rmw dinp.
    std::vector<float> x = randn(NC4, 7), out(NC4), dout = randn(NC4, 8), dx(NC4, 0.f);
    report("gelu fwd", shape4, 8.0 * NC4,
           time_calls([&] { sw::cpu::gelu_forward(out.data(), x.data(), NC4); }, iters));
    report("gelu bwd", shape4, 16.0 * NC4, time_calls([&] {
             sw::cpu::gelu_backward(dx.data(), x.data(), dout.data(), NC4);
           }, iters));
    report("residual", shape4, 12.0 * NC4, time_calls([&] {
             sw::cpu::residual_forward(out.data(), x.data(), dout.data(), NC4);
           }, iters));
  }

  {  // SwiGLU on (N, 2*4C) -> (N, 4C); fwd reads gu, writes out; bwd reads gu, dout, rmw dgu.
    std::vector<float> gu = randn(2 * NC4, 11), out(NC4), dout = randn(NC4, 12), dgu(2 * NC4, 0.f);
    report("swiglu fwd", shape4, 12.0 * NC4,
           time_calls([&] { sw::cpu::swiglu_forward(out.data(), gu.data(), N, C4); }, iters));
    report("swiglu bwd", shape4, 28.0 * NC4, time_calls([&] {
             sw::cpu::swiglu_backward(dgu.data(), dout.data(), gu.data(), N, C4);
           }, iters));
  }

  {  // Embedding with GPT-2's vocabulary: fwd gathers N rows of wte + wpe; bwd scatters them.
    const int V = 50257, T = std::min(N, 1024), B = N / T;
    std::vector<float> wte = randn(size_t(V) * C, 13), wpe = randn(size_t(T) * C, 14), out(NC),
                       dwte(size_t(V) * C, 0.f), dwpe(size_t(T) * C, 0.f), dout = randn(NC, 15);
    std::vector<int32_t> tok(size_t(B) * T);
    sw::Rng rng(16);
    for (auto& t : tok) t = static_cast<int32_t>(rng.below(V));
    report("embedding fwd", shape, 12.0 * NC, time_calls([&] {
             sw::cpu::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
           }, iters));
    report("embedding bwd", shape, 20.0 * NC, time_calls([&] {
             sw::cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
           }, iters));
  }

  {  // RoPE on a packed qkv (N, 3C) with 12 heads of 64 (q and k rotated in place: 2 x 2NC floats).
    std::vector<float> qkv = randn(3 * NC, 17);
    const int T = std::min(N, 1024), B = N / T;
    report("rope fwd", "12x64 heads", 16.0 * NC, time_calls([&] {
             sw::cpu::rope_forward(qkv.data(), B, T, 12, 12, 64, 10000.f);
           }, iters));
  }

  {  // sum_squares (gradient-norm clipping) over (N, 4C) floats.
    std::vector<float> x = randn(NC4, 18);
    double sink = 0;
    report("sum_squares", shape4, 4.0 * NC4,
           time_calls([&] { sink += sw::cpu::sum_squares(x.data(), NC4); }, iters));
    if (sink == 0) std::printf("(unexpected zero)\n");
  }

  {  // AdamW over as many parameters as the (N, 4C) tensor: reads p, g, m, v; writes p, m, v.
    std::vector<float> p = randn(NC4, 9), g = randn(NC4, 10), m(NC4, 0.f), v(NC4, 0.f);
    int step = 0;
    report("adamw", shape4, 28.0 * NC4, time_calls([&] {
             sw::cpu::adamw(p.data(), g.data(), m.data(), v.data(), NC4, 1e-4f, 0.9f, 0.95f, 1e-8f,
                            0.1f, ++step, 1.f);
           }, iters));
  }
  return 0;
}
