// BF16 GEMM throughput against its peers on the GPT-2 124M shapes, in one run, alternating:
//   sgemm   OpenBLAS cblas_sgemm on the fp32 operands (the fp32 path of Shardwise);
//   emul    Shardwise's gemm_lowp(BF16) emulated path: operands rounded to bf16 into fp32
//           copies, then sgemm (the path for CPUs without AVX-512);
//   fused   gemm_lowp(BF16) fused path: AVX-512 FMA microkernels on panels rounded to bf16
//           while packing (no extra pass; what Auto runs where vdpbf16ps is slower than FMA);
//   native  gemm_lowp(BF16) native path: AVX512-BF16 vdpbf16ps microkernels, rounding while
//           packing (only where the CPU has AVX512-BF16);
//   onednn  gemm_lowp(BF16) oneDNN path: operands converted to bf16 copies (timed), then
//           oneDNN's bf16 matmul with fp32 output;
//   dnnl0   oneDNN's bare bf16 matmul on operands converted beforehand (not timed): the
//           engine PyTorch's bf16 autocast uses, and what the onednn path pays for converting;
//   auto    gemm_lowp(BF16) Auto: its per-shape choice (own kernel or onednn, measured on the
//           first call, which is the warm-up here; the "choice" column says which).
// Prints GFLOP/s per shape (median of --reps timed calls per peer, peers interleaved call by
// call) and the ratios to sgemm (and of dnnl0's time over the fastest Shardwise bf16 path),
// then the totals over all shapes (total flops over total median time, each shape counted
// once: the forward, dinp and dW products of a 124M block's four Linears and one 512-row
// LM-head chunk's three, not weighted by the 12 layers or the number of chunks).
//
//   bench_gemm_bf16 [--threads 2] [--reps 5] [--rows 1024] [--d 768] [--vocab 50257]
// (--d, --vocab: another model's shapes, e.g. --d 384 --vocab 8192 --rows 2048)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/threads.h"
#include "bench/gemm_shapes.h"

#include <dnnl.hpp>

int main(int argc, char** argv) {
  GemmBenchArgs args = {2, 5, 1024, 768, 50257};
  if (!parse_gemm_bench_args(argc, argv, "bench_gemm_bf16", args)) return 2;
  const int threads = args.threads, reps = args.reps, rows = args.rows, d = args.d,
            vocab = args.vocab;
  sw::set_num_threads(threads);
  const int R = rows, C = d, V = vocab;
  const std::vector<GemmShape> shapes = gpt2_gemm_shapes(R, C, V);
  const bool hw = sw::cpu::cpu_has_avx512_bf16();
  const bool hwf = sw::cpu::cpu_has_avx512();
  const sw::cpu::LowpPath ap = sw::cpu::lowp_auto_path(sw::DType::BF16);
  std::printf("threads %d, reps %d, AVX512-BF16 %s, Auto path: %s\n", threads, reps,
              hw ? "yes" : "no",
              ap == sw::cpu::LowpPath::Native   ? "native"
              : ap == sw::cpu::LowpPath::Fused  ? "fused"
              : ap == sw::cpu::LowpPath::OneDnn ? "onednn"
                                                : "emulated");
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const bool dnnl_on = hwf;  // the onednn path converts with AVX-512
  std::printf("GFLOP/s (median)       %6s %6s %6s  %7s %7s %7s %7s %7s %7s %7s  %7s %7s %7s %7s %9s  %s\n",
              "M", "N", "K", "sgemm", "emul", "fused", "native", "onednn", "dnnl0", "auto",
              "fused/s", "nat/s", "dnn/s", "auto/s", "dnnl0/own", "choice");
  double tf = 0, ts = 0, te = 0, tu = 0, tn = 0, td = 0, to = 0, ta_ = 0;
  for (const GemmShape& s : shapes) {
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    std::vector<float> A((size_t)s.M * s.K), B((size_t)s.K * s.N), Cs((size_t)s.M * s.N),
        Ce((size_t)s.M * s.N), Cu((size_t)s.M * s.N), Cn((size_t)s.M * s.N),
        Co((size_t)s.M * s.N), Ca((size_t)s.M * s.N);
    uint32_t x = 12345;
    auto rnd = [&] {
      x = x * 1664525u + 1013904223u;
      return (float)((x >> 8) & 0xffff) / 65536.f - 0.5f;
    };
    for (float& v : A) v = rnd();
    for (float& v : B) v = rnd();
    auto run_s = [&] {
      sw::cpu::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, Cs.data(),
                    s.N);
    };
    auto run_e = [&] {
      sw::cpu::gemm_lowp(sw::DType::BF16, s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda,
                         B.data(), ldb, 0.f, Ce.data(), s.N, sw::cpu::LowpPath::Emulated);
    };
    auto run_u = [&] {
      if (hwf)
        sw::cpu::gemm_lowp(sw::DType::BF16, s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda,
                           B.data(), ldb, 0.f, Cu.data(), s.N, sw::cpu::LowpPath::Fused);
    };
    auto run_n = [&] {
      if (hw)
        sw::cpu::gemm_lowp(sw::DType::BF16, s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda,
                           B.data(), ldb, 0.f, Cn.data(), s.N, sw::cpu::LowpPath::Native);
    };
    auto run_o = [&] {
      if (dnnl_on)
        sw::cpu::gemm_lowp(sw::DType::BF16, s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda,
                           B.data(), ldb, 0.f, Co.data(), s.N, sw::cpu::LowpPath::OneDnn);
    };
    auto run_a = [&] {
      sw::cpu::gemm_lowp(sw::DType::BF16, s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda,
                         B.data(), ldb, 0.f, Ca.data(), s.N);
    };
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    dnnl::memory::desc amd({s.M, s.K}, dt::bf16, s.ta ? tag::ba : tag::ab);
    dnnl::memory::desc bmd({s.K, s.N}, dt::bf16, s.tb ? tag::ba : tag::ab);
    dnnl::memory::desc cmd({s.M, s.N}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(amd, bmd, cmd), eng);
    dnnl::matmul mm(pd);
    dnnl::memory am(amd, eng), bm(bmd, eng), cm(cmd, eng);
    {
      auto* pa = static_cast<uint16_t*>(am.get_data_handle());
      auto* pb = static_cast<uint16_t*>(bm.get_data_handle());
      for (size_t i = 0; i < A.size(); ++i) pa[i] = sw::f32_to_bf16(A[i]);
      for (size_t i = 0; i < B.size(); ++i) pb[i] = sw::f32_to_bf16(B[i]);
    }
    auto run_d = [&] {
      mm.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      strm.wait();
    };
    run_s();
    run_e();
    run_u();
    run_n();
    if (dnnl_on) run_d();
    run_o();
    run_a();  // Auto's first call: measures and chooses for this shape
    std::vector<double> t_s, t_e, t_u, t_n, t_d, t_o, t_a;
    for (int r = 0; r < reps; ++r) {
      t_s.push_back(timed(run_s));
      t_e.push_back(timed(run_e));
      if (hwf) t_u.push_back(timed(run_u));
      if (hw) t_n.push_back(timed(run_n));
      if (dnnl_on) t_d.push_back(timed(run_d));
      if (dnnl_on) t_o.push_back(timed(run_o));
      t_a.push_back(timed(run_a));
    }
    const double fl = 2.0 * s.M * s.N * s.K;
    const double ms = median(t_s), me = median(t_e), mu = hwf ? median(t_u) : 0,
                 mn = hw ? median(t_n) : 0, md = dnnl_on ? median(t_d) : 0,
                 mo = dnnl_on ? median(t_o) : 0, ma = median(t_a);
    tf += fl, ts += ms, te += me, tu += mu, tn += mn, td += md, to += mo, ta_ += ma;
    const sw::cpu::LowpPath ch = sw::cpu::lowp_shape_choice(s.ta, s.tb, s.M, s.N, s.K);
    auto row = [&](const char* name, int M, int N, int K, double fs, double ms_, double me_,
                   double mu_, double mn_, double md_, double mo_, double ma_,
                   const char* choice) {
      auto g = [&](double t) { return t > 0 ? fs / t / 1e9 : 0.0; };
      auto r = [&](double t) { return t > 0 ? ms_ / t : 0.0; };
      double best = me_;
      if (mu_ > 0) best = std::min(best, mu_);
      if (mn_ > 0) best = std::min(best, mn_);
      std::printf("%-22s %6d %6d %6d  %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f  %6.2fx %6.2fx "
                  "%6.2fx %6.2fx %8.2fx  %s\n",
                  name, M, N, K, g(ms_), g(me_), g(mu_), g(mn_), g(mo_), g(md_), g(ma_), r(mu_),
                  r(mn_), r(mo_), r(ma_), md_ > 0 ? best / md_ : 0.0, choice);
      std::fflush(stdout);
    };
    row(s.name, s.M, s.N, s.K, fl, ms, me, mu, mn, md, mo, ma,
        ch == sw::cpu::LowpPath::OneDnn   ? "onednn"
        : ch == sw::cpu::LowpPath::Native ? "native"
        : ch == sw::cpu::LowpPath::Fused  ? "fused"
        : ch == sw::cpu::LowpPath::Auto   ? "-"
                                          : "emulated");
    if (&s == &shapes.back())
      row("total (all shapes)", 0, 0, 0, tf, ts, te, tu, tn, td, to, ta_, "");
  }
  return 0;
}
