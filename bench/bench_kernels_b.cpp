// Throughput of the GEMM-heavy CPU kernels at GPT-2 124M shapes (B=4, T=256, C=768, H=12,
// V=50257), each reported as a fraction of the plain sgemm rate measured in the same run.
//
//   bench_kernels_b [--threads N] [--reps R] [--quick] [--cpu] [--bf16-attention]
//
// --bf16-attention: only the bf16 attention rows (issue 39's small GPT-2 shape; the fp32-FMA
// tile products against the AVX512-BF16 ones, on a CPU that has it).
//
// --cpu times with the process's CPU clock instead of the wall clock: on a shared, busy machine
// run it with --threads 1, where CPU time is the time the work itself took (with more threads
// it also counts OpenMP's spin-waiting).
//
// Method: every measurement is warmed up once, then timed R times (wall clock); the median is
// reported. FLOP counts are model FLOPs:
//   sgemm / linear fwd: 2*M*N*K; linear bwd: 4*N*C*OC (dinp + dw; db is O(N*OC));
//   attention fwd: 4*B*H*hd*T(T+1)/2 (QK^T and PV on the causal half);
//   attention bwd: 2x forward (dQ, dK, dV, dP; the recomputed QK^T is not counted, so the
//   fraction is what the step sees);
//   LM head fwd+bwd: 6*N*C*V (logits, dx, dw); fwd only: 2*N*C*V.
// The reference ("roofline") is the best plain-sgemm rate over the GEMM shapes of one training
// step (forward NT, backward NN and TN of each Linear, the LM head's three). Also printed: the
// FLOP-weighted rate of those GEMMs, i.e. what one step's GEMMs would achieve called directly
// (lower: OpenBLAS is slower on some of these shapes, e.g. K = V = 50257).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/threads.h"

extern "C" char* openblas_get_corename(void);

namespace {

int g_reps = 5;
bool g_cpu = false;

double now() {
  if (g_cpu) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of fn over g_reps runs after one warm-up.
double time_median(const std::function<void()>& fn, int reps = -1) {
  if (reps < 0) reps = g_reps;
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    fn();
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Medians of fa and fb timed alternately (a, b, a, b, ...) after one warm-up each, so slow
// drifts of a shared machine hit both alike.
std::pair<double, double> time_paired(const std::function<void()>& fa,
                                      const std::function<void()>& fb, int reps = -1) {
  if (reps < 0) reps = g_reps;
  fa();
  fb();
  std::vector<double> ta, tb;
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    fa();
    ta.push_back(now() - t0);
    t0 = now();
    fb();
    tb.push_back(now() - t0);
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

std::vector<float> randv(size_t n, uint64_t seed, float sd = 1.f) {
  std::vector<float> v(n);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) v[i] = sd * sw::rng_normal(seed, 0, i);
  return v;
}

struct Gemm {
  const char* what;
  bool ta, tb;
  int M, N, K;
  double count;  // how many times one step runs it
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  bool quick = false, attention_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      g_reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true, g_reps = 3;
    else if (!std::strcmp(argv[i], "--cpu"))
      g_cpu = true;
    else if (!std::strcmp(argv[i], "--bf16-attention"))
      attention_only = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--reps R] [--quick] [--cpu] [--bf16-attention]\n",
                   argv[0]);
      return 2;
    }
  }
  sw::set_num_threads(threads);
  const int B = 4, T = 256, C = 768, H = 12, hd = C / H, V = 50257, L = 12, N = B * T;
  // Touch the kernels once so OpenBLAS's core is selected before we print it.
  {
    float a = 1, b = 1, c = 0;
    sw::cpu::gemm(false, false, 1, 1, 1, 1.f, &a, 1, &b, 1, 0.f, &c, 1);
  }
  std::printf(
      "# bench_kernels_b: threads=%d reps=%d (median after 1 warm-up, %s time), "
      "OpenBLAS core %s\n",
      threads, g_reps, g_cpu ? "process CPU" : "wall", openblas_get_corename());
  std::printf("# GPT-2 124M shapes: B=%d T=%d C=%d H=%d hd=%d V=%d\n", B, T, C, H, hd, V);

  // ---- 0. bf16 attention (issue 39's small GPT-2: B 8, T 256, H 6, hd 64) --------------------
  // As the Ops call it in a bf16 step (16-bit qkv, out and dout read in place): the fp32-FMA
  // tile products on rounded operands (the path without AVX512-BF16; "fma") against the
  // vdpbf16ps ones ("native"), timed alternately.
  if (sw::cpu::cpu_has_avx512_bf16()) {
    const int Bs = 8, Hs = 6, Cs = Hs * hd, Ns = Bs * T, Rs = 3 * Cs;
    auto b16 = [](const std::vector<float>& v) {
      std::vector<uint16_t> r(v.size());
      for (size_t i = 0; i < v.size(); ++i) r[i] = sw::f32_to_bf16(v[i]);
      return r;
    };
    const auto q16 = b16(randv((size_t)Ns * Rs, 4)), d16 = b16(randv((size_t)Ns * Cs, 5));
    std::vector<float> out((size_t)Ns * Cs), lse((size_t)Bs * Hs * T), dqkv((size_t)Ns * Rs);
    sw::cpu::attention_forward(out.data(), lse.data(), nullptr, Bs, T, Hs, Hs, hd,
                               sw::DType::BF16, q16.data());
    const auto o16 = b16(out);
    const double fl = 4.0 * Bs * Hs * hd * T * (T + 1) / 2.0;
    auto fwd = [&](bool native) {
      return [&, native] {
        sw::cpu::set_attention_bf16_native(native);
        sw::cpu::attention_forward(out.data(), lse.data(), nullptr, Bs, T, Hs, Hs, hd,
                                   sw::DType::BF16, q16.data());
      };
    };
    auto bwd = [&](bool native) {
      return [&, native] {
        sw::cpu::set_attention_bf16_native(native);
        sw::cpu::attention_backward(dqkv.data(), nullptr, nullptr, nullptr, lse.data(), Bs, T, Hs,
                                    Hs, hd, sw::DType::BF16, true, q16.data(), o16.data(),
                                    d16.data());
      };
    };
    const auto [tf0, tf1] = time_paired(fwd(false), fwd(true), 3 * g_reps);
    const auto [tb0, tb1] = time_paired(bwd(false), bwd(true), 3 * g_reps);
    sw::cpu::set_attention_bf16_native(true);
    std::printf("\n## bf16 attention, B=%d T=%d H=%d hd=%d (16-bit operands): fma vs native\n",
                Bs, T, Hs, hd);
    std::printf("%-16s %9s %8s %9s %8s %8s\n", "op", "fma ms", "GFLOP/s", "native ms", "GFLOP/s",
                "speedup");
    auto row2 = [](const char* name, double flops, double t0, double t1) {
      std::printf("%-16s %9.2f %8.1f %9.2f %8.1f %7.2fx\n", name, t0 * 1e3, flops / t0 / 1e9,
                  t1 * 1e3, flops / t1 / 1e9, t0 / t1);
    };
    row2("attention fwd", fl, tf0, tf1);
    row2("attention bwd", 2 * fl, tb0, tb1);
  }

  if (attention_only) return 0;

  // Buffers big enough for every shape.
  const size_t big = (size_t)std::max(V, 4 * C) * C;
  const auto A = randv((size_t)N * 4 * C, 1, 0.5f), Bm = randv(big, 2, 0.02f);
  const auto Lg = randv((size_t)N * V, 9, 1e-3f);  // stands in for (N, V) dlogits
  std::vector<float> Cm((size_t)N * V, 0.f);

  // ---- 1. plain sgemm at the step's shapes ------------------------------------------------
  // Linear layers per block: qkv (C -> 3C), attn proj (C -> C), fc (C -> 4C), fc proj (4C -> C).
  struct Lin {
    const char* name;
    int C, OC;
  };
  const Lin lins[] = {
      {"qkv", C, 3 * C}, {"attn.proj", C, C}, {"fc", C, 4 * C}, {"fc.proj", 4 * C, C}};
  std::vector<Gemm> gemms;
  for (const Lin& l : lins) {
    gemms.push_back({l.name, false, true, N, l.OC, l.C, (double)L});   // fwd: out = x W^T
    gemms.push_back({l.name, false, false, N, l.C, l.OC, (double)L});  // bwd: dx = dy W
    gemms.push_back({l.name, true, false, l.OC, l.C, N, (double)L});   // bwd: dW = dy^T x
  }
  gemms.push_back({"lm_head", false, true, N, V, C, 1});   // logits
  gemms.push_back({"lm_head", false, false, N, C, V, 1});  // dx
  gemms.push_back({"lm_head", true, false, V, C, N, 1});   // dw
  std::printf("\n## sgemm (cblas_sgemm row-major through sw::cpu::gemm)\n");
  std::printf("%-10s %-3s %6s %6s %6s %9s %8s\n", "layer", "op", "M", "N", "K", "ms", "GFLOP/s");
  double step_flops = 0, step_time = 0, best_rate = 0;
  for (const Gemm& g : gemms) {
    if (quick && g.M * (double)g.N * g.K > 1e10) continue;
    const int lda = g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N;
    const float* a = (size_t)g.M * g.K > A.size() ? Lg.data() : A.data();
    const double t = time_median([&] {
      sw::cpu::gemm(g.ta, g.tb, g.M, g.N, g.K, 1.f, a, lda, Bm.data(), ldb, 1.f, Cm.data(), g.N);
    });
    const double fl = 2.0 * g.M * g.N * g.K, rate = fl / t / 1e9;
    std::printf("%-10s %c%c  %6d %6d %6d %9.2f %8.1f\n", g.what, g.ta ? 'T' : 'N', g.tb ? 'T' : 'N',
                g.M, g.N, g.K, t * 1e3, rate);
    step_flops += g.count * fl;
    step_time += g.count * t;
    best_rate = std::max(best_rate, rate);
  }
  const double roof = best_rate;
  std::printf(
      "sgemm roofline (best shape): %.1f GFLOP/s; FLOP-weighted over one step's GEMMs: "
      "%.1f GFLOP/s (%.1f%%)\n",
      roof, step_flops / step_time / 1e9, 100.0 * step_flops / step_time / 1e9 / roof);

  // sgemm called from inside our own parallel region: OpenBLAS's OpenMP build must run it on
  // the calling thread alone. Thread 0 makes a 1024^3 call while the other threads wait; its
  // own CPU time then covers all the work (a split call would leave it about 1/threads).
  {
    const int n = 1024;
    auto thread_cpu = [] {
      timespec ts;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return ts.tv_sec + 1e-9 * ts.tv_nsec;
    };
    auto call = [&] {
      sw::cpu::gemm(false, false, n, n, n, 1.f, A.data(), n, Bm.data(), n, 0.f, Cm.data(), n);
    };
    double inside = 1e30, alone = 1e30;
    sw::set_num_threads(1);
    call();
    for (int r = 0; r < 3; ++r) {
      const double c0 = thread_cpu();
      call();
      alone = std::min(alone, thread_cpu() - c0);
    }
    sw::set_num_threads(threads);
    call();
    for (int r = 0; r < 4; ++r) {
#pragma omp parallel
      if (omp_get_thread_num() == 0) {
        const double c0 = thread_cpu();
        call();
        if (r > 0) inside = std::min(inside, thread_cpu() - c0);
      }
    }
    std::printf(
        "sgemm %d^3 from inside omp parallel: calling thread's CPU time %.1f ms "
        "(%.0f%% of a 1-thread call's: ~100%% = ran single-threaded)\n",
        n, inside * 1e3, 100.0 * inside / alone);
  }

  // own: median time of the sgemm calls the kernel makes (same shapes, called directly,
  // timed interleaved with the kernel); 0 when there is no such reference.
  auto row = [&](const char* name, double flops, double t, double own = 0) {
    const double rate = flops / t / 1e9;
    std::printf("%-28s %9.2f %8.1f %7.1f%%", name, t * 1e3, rate, 100.0 * rate / roof);
    if (own > 0) std::printf(" %9.1f%%", 100.0 * own / t);
    std::printf("\n");
  };

  // ---- 2. Linear ---------------------------------------------------------------------------
  std::printf(
      "\n## kernels: %% of the sgemm roofline above; %% of the same sgemm calls made directly\n");
  std::printf("%-28s %9s %8s %8s %10s\n", "op", "ms", "GFLOP/s", "of roof", "of sgemm");
  {
    const auto bias = randv(4 * C, 3);
    std::vector<float> dinp((size_t)N * 4 * C, 0.f), db(4 * C, 0.f);
    double lf = 0, lt = 0, lo = 0, bf = 0, bt = 0, bo = 0;
    for (const Lin& l : lins) {
      const double fl = 2.0 * N * l.C * l.OC;
      const auto [t, to] = time_paired(
          [&] {
            sw::cpu::linear_forward(Cm.data(), A.data(), Bm.data(), bias.data(), N, l.C, l.OC);
          },
          [&] {
            sw::cpu::gemm(false, true, N, l.OC, l.C, 1.f, A.data(), l.C, Bm.data(), l.C, 1.f,
                          Cm.data(), l.OC);
          });
      const auto [tb, tbo] = time_paired(
          [&] {
            sw::cpu::linear_backward(dinp.data(), Cm.data(), db.data(), A.data(), A.data(),
                                     Bm.data(), N, l.C, l.OC);
          },
          [&] {
            sw::cpu::gemm(false, false, N, l.C, l.OC, 1.f, A.data(), l.OC, Bm.data(), l.C, 1.f,
                          dinp.data(), l.C);
            sw::cpu::gemm(true, false, l.OC, l.C, N, 1.f, A.data(), l.OC, A.data(), l.C, 1.f,
                          Cm.data(), l.C);
          });
      row((std::string("linear fwd ") + l.name).c_str(), fl, t, to);
      row((std::string("linear bwd ") + l.name).c_str(), 2 * fl, tb, tbo);
      lf += fl, lt += t, lo += to, bf += 2 * fl, bt += tb, bo += tbo;
    }
    row("linear fwd (4 layers)", lf, lt, lo);
    row("linear bwd (4 layers)", bf, bt, bo);
  }

  // ---- 3. Attention ------------------------------------------------------------------------
  {
    const size_t nqkv = (size_t)N * 3 * C;
    const auto qkv = randv(nqkv, 4), dout = randv((size_t)N * C, 5);
    std::vector<float> out((size_t)N * C), lse((size_t)B * H * T), dqkv(nqkv, 0.f);
    const double fl = 4.0 * B * H * hd * T * (T + 1) / 2.0;
    const double t = time_median(
        [&] { sw::cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, H, hd); },
        3 * g_reps);
    const double tb = time_median(
        [&] {
          sw::cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                      B, T, H, H, hd);
        },
        3 * g_reps);
    row("attention fwd", fl, t);
    row("attention bwd", 2 * fl, tb);
    // GQA variant (4 kv heads) for reference.
    const int KVH = 4;
    const size_t nq2 = (size_t)N * (H + 2 * KVH) * hd;
    const auto qkv2 = randv(nq2, 6);
    std::vector<float> dqkv2(nq2, 0.f);
    const double t2 = time_median(
        [&] { sw::cpu::attention_forward(out.data(), lse.data(), qkv2.data(), B, T, H, KVH, hd); },
        3 * g_reps);
    const double tb2 = time_median(
        [&] {
          sw::cpu::attention_backward(dqkv2.data(), dout.data(), qkv2.data(), out.data(),
                                      lse.data(), B, T, H, KVH, hd);
        },
        3 * g_reps);
    row("attention fwd (GQA KVH=4)", fl, t2);
    row("attention bwd (GQA KVH=4)", 2 * fl, tb2);
  }

  // ---- 4. LM head + cross-entropy -----------------------------------------------------------
  {
    const auto x = randv((size_t)N * C, 7);
    std::vector<int32_t> tg(N);
    for (int n = 0; n < N; ++n) tg[n] = (int32_t)sw::rng_bits(8, 0, n) % V;
    std::vector<float> loss(N), dx((size_t)N * C, 0.f);
    const double fl = 2.0 * N * C * V;
    const auto [t, to] = time_paired(
        [&] {
          sw::cpu::lmhead_xent(loss.data(), nullptr, nullptr, x.data(), Bm.data(), tg.data(), N, C,
                               V, 1.f);
        },
        [&] {
          sw::cpu::gemm(false, true, N, V, C, 1.f, x.data(), C, Bm.data(), C, 0.f, Cm.data(), V);
        });
    const auto [tb, tbo] = time_paired(
        [&] {
          sw::cpu::lmhead_xent(loss.data(), dx.data(), Cm.data(), x.data(), Bm.data(), tg.data(), N,
                               C, V, 1.f / N);
        },
        [&] {  // the three GEMMs unchunked, on full (N, V) logits
          sw::cpu::gemm(false, true, N, V, C, 1.f, x.data(), C, Bm.data(), C, 0.f, Cm.data(), V);
          sw::cpu::gemm(false, false, N, C, V, 1.f, Lg.data(), V, Bm.data(), C, 1.f, dx.data(), C);
          sw::cpu::gemm(true, false, V, C, N, 1.f, Lg.data(), V, x.data(), C, 1.f, Cm.data(), C);
        });
    row("lm head + xent fwd (eval)", fl, t, to);
    row("lm head + xent fwd+bwd", 3 * fl, tb, tbo);
  }
  return 0;
}
