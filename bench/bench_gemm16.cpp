// The step's bf16 products on 16-bit operands: oneDNN's matmul reading them in place
// (gemm_bf16_onednn with both operands given in bf16) against what the step runs,
// gemm_bf16_16 (Shardwise's own AVX512-BF16 kernels, gemm_bf16_tn.cpp; oneDNN itself where the
// dispatcher keeps it, the LM head's 512-row x w^T and dl w), on the same operands.
// Prints GFLOP/s per shape (median of --reps calls, the two interleaved call by call), the
// ratio own / oneDNN, and the largest difference between the two results relative to the
// largest |C| (both accumulate in fp32; only the summation order differs).
//
//   bench_gemm16 [--threads 2] [--reps 9] [--rows 2048] [--d 384] [--vocab 8192]
// The shapes: the forward, input-gradient and weight-gradient products of a block's four
// Linears (rows = the step's tokens) and of one 512-row LM-head chunk, as bench_gemm_bf16.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/threads.h"
#include "bench/gemm_shapes.h"

int main(int argc, char** argv) {
  GemmBenchArgs args = {2, 9, 2048, 384, 8192};
  if (!parse_gemm_bench_args(argc, argv, "bench_gemm16", args)) return 2;
  const int threads = args.threads, reps = args.reps, rows = args.rows, d = args.d,
            vocab = args.vocab;
  if (!sw::cpu::cpu_has_avx512_bf16()) {
    std::printf("bench_gemm16: this CPU has no AVX512-BF16; nothing to compare\n");
    return 0;
  }
  sw::set_num_threads(threads);
  {  // a second of work first: under bench/quiet.sh the first second is its own renicing pass
    const double t0 = now_s();
    volatile double acc = 0;
    while (now_s() - t0 < 1.0) acc = acc + 1.0;
  }
  const int R = rows, C = d, V = vocab;
  const std::vector<GemmShape> shapes = gpt2_gemm_shapes(R, C, V);
  std::printf("threads %d, reps %d\n%-20s %6s %6s %6s %9s %9s %7s %9s\n", threads, reps,
              "GFLOP/s (median)",
              "M", "N", "K", "onednn", "own", "own/dnn", "max|d|/|C|");
  double tf = 0, to = 0, tw = 0;
  for (const GemmShape& s : shapes) {
    std::vector<uint16_t> A((size_t)s.K * s.M), B((size_t)s.K * s.N);
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    uint32_t x = 12345;
    auto rnd = [&] {
      x = x * 1664525u + 1013904223u;
      return (float)((x >> 8) & 0xffff) / 65536.f - 0.5f;
    };
    for (auto& v : A) v = sw::f32_to_bf16(rnd());
    for (auto& v : B) v = sw::f32_to_bf16(rnd());
    std::vector<float> Co((size_t)s.M * s.N), Cw((size_t)s.M * s.N);
    auto run_o = [&] {
      sw::cpu::detail::gemm_bf16_onednn(s.ta, s.tb, s.M, s.N, s.K, 1.f, nullptr, A.data(), lda,
                                        nullptr, B.data(), ldb, 0.f, Co.data(), s.N);
    };
    auto run_w = [&] {
      sw::cpu::detail::gemm_bf16_16(s.ta, s.tb, s.M, s.N, s.K, 1.f, nullptr, A.data(), lda,
                                    nullptr, B.data(), ldb, 0.f, Cw.data(), s.N);
    };
    run_o();
    run_w();
    std::vector<double> t_o, t_w;
    for (int r = 0; r < reps; ++r) {
      t_o.push_back(timed(run_o));
      t_w.push_back(timed(run_w));
    }
    double dmax = 0, cmax = 0;
    for (size_t i = 0; i < Co.size(); ++i) {
      dmax = std::max(dmax, (double)std::fabs(Co[i] - Cw[i]));
      cmax = std::max(cmax, (double)std::fabs(Co[i]));
    }
    const double fl = 2.0 * s.M * s.N * s.K, mo = median(t_o), mw = median(t_w);
    tf += fl, to += mo, tw += mw;
    std::printf("%-20s %6d %6d %6d %9.1f %9.1f %6.2fx %9.1e\n", s.name, s.M, s.N, s.K,
                fl / mo / 1e9, fl / mw / 1e9, mo / mw, cmax > 0 ? dmax / cmax : 0.0);
  }
  std::printf("%-20s %6s %6s %6s %9.1f %9.1f %6.2fx\n", "total", "", "", "", tf / to / 1e9,
              tf / tw / 1e9, to / tw);
  return 0;
}
