// CPU kernels B: GEMM / Linear, causal GQA attention, fused LM head + cross-entropy.
//
// References are written here, naively, in double precision: GEMM and Linear as triple loops,
// attention as a full (T, T) softmax with the causal mask, the LM head as full logits followed
// by log-softmax. Backward passes are checked against central finite differences, either of the
// double reference (tight: the only error left is our fp32 analytic gradient) or of our own
// fp32 forward on small shapes (looser, see below). Plus: the "+=" rule on prefilled gradient
// buffers, null optional outputs, ignored targets, grad_scale, odd sizes (T not a multiple of the
// attention tiles, T = 1, N not a multiple of the LM-head chunk) and bit-identical reruns.
//
// Tolerances (each set a few times above the error measured when the test was written, except
// the first, which is a proven bound):
//  * GEMM-like sums of K fp32 products: per element the rounding-error bound
//    (K + 2) u (|alpha| sum_k |a_k b_k| + |beta c|), u = 2^-24, holds for any summation order;
//    blocked/FMA summation does much better, so exceeding it means a wrong result.
//  * exact identities where they hold: grad_scale = 0.25 gives exactly 0.25x the gradients of
//    grad_scale = 1; eval mode and one-sided gradients give bit-identical losses/gradients.
//  * attention / softmax: exp_approx is within ~2 ulp of exp and the sums are over <= T terms,
//    so outputs carry ~1e-6 error on O(1) values (measured <= 1.3e-6); we allow 1e-5.
//  * finite differences of a double reference with h = 2^-10 (x +- h is exact in fp32 for
//    |x| < 2^13): truncation h^2/6 |f'''| ~ 1e-7, so the error measured is that of our fp32
//    gradient, ~1e-5 relative (measured <= 2.4e-5); tolerance 2e-4 with a 1e-3 floor for
//    near-zero gradients.
//  * finite differences of our fp32 forward with h = 1e-2: the loss carries ~1e-7 sqrt(#outputs)
//    rounding error, /2h ~ 1e-5..1e-4 on these tiny shapes, plus h^2 truncation ~1e-4;
//    tolerance 1e-2 with a 1e-2 floor.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/threads.h"
#include "tests/common/gradcheck.h"
#include "tests/kernels/kernel_test_util.h"

extern "C" char* openblas_get_corename(void);
extern "C" int openblas_get_parallel(void);  // 0 sequential, 1 pthreads, 2 OpenMP

namespace {

using swtest::check_grad;
using swtest::DVec;
using swtest::kU;
using swtest::randv;
using swtest::same_bits;
using swtest::Vec;
constexpr float kHRef = 1.0f / 1024;  // FD step on double references

double max_abs_diff(const float* a, const double* r, size_t n) {
  double e = 0;
  for (size_t i = 0; i < n; ++i) e = std::max(e, std::fabs(a[i] - r[i]));
  return e;
}

// Central differences on a chosen list of indices, with gradcheck.h's normalised metric.
swtest::GradCheck fd_at(const std::function<double()>& f, float* x, const float* analytic,
                        const std::vector<size_t>& idx, float h, double floor) {
  swtest::GradCheck r;
  for (size_t i : idx) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const double lp = f();
    x[i] = x0 - h;
    const double lm = f();
    x[i] = x0;
    const double num = (lp - lm) / (static_cast<double>(x0 + h) - static_cast<double>(x0 - h));
    const double a = analytic[i];
    const double err = std::fabs(a - num) / std::max({std::fabs(a), std::fabs(num), floor});
    ++r.checked;
    if (err >= r.max_err) r.max_err = err, r.worst = i, r.analytic = a, r.numeric = num;
  }
  return r;
}

// ------------------------------------------------------------------------------------------
// GEMM / Linear references

// C(M,N) = alpha op(A) op(B) + beta C in double; also returns the bound K u (|alpha| sum|ab| +
// |beta C|) per element (+1e-30).
void gemm_ref(bool ta, bool tb, int M, int N, int K, float alpha, const Vec& A, int lda,
              const Vec& B, int ldb, float beta, const Vec& C0, int ldc, DVec& C, DVec& bound) {
  swtest::gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, C, bound);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double& b = bound[(size_t)i * ldc + j];
      b = (K + 2) * kU * b + 1e-30;
    }
}

}  // namespace

TEST_CASE("the loaded OpenBLAS is the OpenMP build") {
  // The build links the openmp variant by path and sets an RPATH; without it the dynamic
  // loader picks whatever Debian's alternatives point at (the pthreads build by default), whose
  // own thread pool then competes with our OpenMP threads.
  CHECK(openblas_get_parallel() == 2);
}

TEST_CASE("OpenBLAS uses vector kernels on AVX2/AVX-512 machines") {
  // OpenBLAS 0.3.21 falls back to SSE3 "Prescott" kernels on CPUs it does not know (6x
  // slower); gemm.cpp re-selects. Only checked when the user did not force a core type.
  sw::cpu::gemm(false, false, 1, 1, 1, 1.f, std::vector<float>{1.f}.data(), 1,
                std::vector<float>{1.f}.data(), 1, 0.f, std::vector<float>{0.f}.data(), 1);
  __builtin_cpu_init();
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if ((forced && *forced) || !__builtin_cpu_supports("avx2")) return;
  const std::string core = openblas_get_corename();
  INFO("OpenBLAS core: " << core);
  CHECK(core != "Prescott");
  CHECK(core != "Core2");
  CHECK(core != "Nehalem");
  CHECK(core != "Sandybridge");
}

TEST_CASE("gemm matches a double reference for all transposes and padded leading dims") {
  sw::set_num_threads(2);
  struct Shape {
    int M, N, K;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{5, 7, 3}, Shape{33, 65, 47}, Shape{130, 97, 200}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int M = s.M, N = s.N, K = s.K;
        const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
        const Vec A = randv((size_t)(ta ? K : M) * lda, 1 + M + ta);
        const Vec B = randv((size_t)(tb ? N : K) * ldb, 2 + N + tb);
        const Vec C0 = randv((size_t)M * ldc, 3 + K);
        for (float beta : {0.f, 1.f, -0.5f}) {
          const float alpha = 0.75f;
          Vec C = C0;
          sw::cpu::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          DVec R, bound;
          gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, R, bound);
          int bad = 0, pad_touched = 0;
          for (int i = 0; i < M; ++i)
            for (int j = 0; j < ldc; ++j) {
              const size_t o = (size_t)i * ldc + j;
              if (j >= N)
                pad_touched += C[o] != C0[o];  // columns past N belong to someone else
              else
                bad += std::fabs(C[o] - R[o]) > bound[o];
            }
          INFO("M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb
                    << " beta=" << beta);
          CHECK(bad == 0);
          CHECK(pad_touched == 0);
        }
      }
}

TEST_CASE("linear forward and backward match references and finite differences") {
  sw::set_num_threads(2);
  const int N = 37, C = 29, OC = 300;  // OC > 256 exercises two db column blocks
  const Vec inp = randv((size_t)N * C, 11), w = randv((size_t)OC * C, 12, 0.2f), b = randv(OC, 13),
            proj = randv((size_t)N * OC, 14);

  // Forward, with and without bias.
  for (bool with_b : {true, false}) {
    Vec out((size_t)N * OC, 123.f);  // garbage must be overwritten
    sw::cpu::linear_forward(out.data(), inp.data(), w.data(), with_b ? b.data() : nullptr, N, C,
                            OC);
    int bad = 0;
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) {
        double s = with_b ? b[o] : 0.0, sa = std::fabs(s);
        for (int c = 0; c < C; ++c) {
          s += (double)inp[(size_t)n * C + c] * w[(size_t)o * C + c];
          sa += std::fabs((double)inp[(size_t)n * C + c] * w[(size_t)o * C + c]);
        }
        bad += std::fabs(out[(size_t)n * OC + o] - s) > (C + 2) * kU * sa + 1e-30;
      }
    INFO("bias=" << with_b);
    CHECK(bad == 0);
  }

  // Backward into prefilled buffers (+= rule) against a double reference.
  const Vec dinp0 = randv(inp.size(), 21), dw0 = randv(w.size(), 22), db0 = randv(b.size(), 23);
  Vec dinp = dinp0, dw = dw0, db = db0;
  sw::cpu::linear_backward(dinp.data(), dw.data(), db.data(), proj.data(), inp.data(), w.data(), N,
                           C, OC);
  {
    int bad = 0;
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) {
        double s = dinp0[(size_t)n * C + c], sa = std::fabs(s);
        for (int o = 0; o < OC; ++o) {
          const double t = (double)proj[(size_t)n * OC + o] * w[(size_t)o * C + c];
          s += t, sa += std::fabs(t);
        }
        bad += std::fabs(dinp[(size_t)n * C + c] - s) > (OC + 2) * kU * sa;
      }
    for (int o = 0; o < OC; ++o)
      for (int c = 0; c < C; ++c) {
        double s = dw0[(size_t)o * C + c], sa = std::fabs(s);
        for (int n = 0; n < N; ++n) {
          const double t = (double)proj[(size_t)n * OC + o] * inp[(size_t)n * C + c];
          s += t, sa += std::fabs(t);
        }
        bad += std::fabs(dw[(size_t)o * C + c] - s) > (N + 2) * kU * sa;
      }
    for (int o = 0; o < OC; ++o) {
      double s = db0[o], sa = std::fabs(s);
      for (int n = 0; n < N; ++n)
        s += proj[(size_t)n * OC + o], sa += std::fabs(proj[(size_t)n * OC + o]);
      bad += std::fabs(db[o] - s) > (N + 2) * kU * sa;
    }
    CHECK(bad == 0);
  }

  // Null dinp / db leave nothing behind; dw alone is the same as before.
  {
    Vec dw2 = dw0;
    sw::cpu::linear_backward(nullptr, dw2.data(), nullptr, proj.data(), inp.data(), w.data(), N, C,
                             OC);
    CHECK(same_bits(dw2, dw));
  }

  // Finite differences of L = dot(linear(inp), proj) through our fp32 forward. L is linear in
  // each input, so the central difference has no truncation error: only fp32 rounding of the
  // outputs, ~1e-7 * sqrt(OC) / 2h ~ 1e-4 absolute on gradients of size ~1.
  {
    Vec x = inp, ww = w, bb = b, out((size_t)N * OC);
    auto loss = [&] {
      sw::cpu::linear_forward(out.data(), x.data(), ww.data(), bb.data(), N, C, OC);
      return swtest::dot(out.data(), proj.data(), out.size());
    };
    Vec gi(inp.size(), 0.f), gw(w.size(), 0.f), gb(b.size(), 0.f);
    sw::cpu::linear_backward(gi.data(), gw.data(), gb.data(), proj.data(), inp.data(), w.data(), N,
                             C, OC);
    for (auto [name, xv, g] :
         {std::tuple{"dinp", &x, &gi}, std::tuple{"dw", &ww, &gw}, std::tuple{"db", &bb, &gb}}) {
      const auto r = check_grad(loss, xv->data(), g->data(), xv->size(), 48, 1e-2f, 1e-1);
      REPORT(name << ": " << r.str());
      CHECK(r.max_err < 1e-2);
    }
  }

  // Bit-identical reruns (2 threads).
  {
    Vec a1((size_t)N * C, 0.f), w1(w.size(), 0.f), b1(OC, 0.f);
    Vec a2 = a1, w2 = w1, b2 = b1;
    sw::cpu::linear_backward(a1.data(), w1.data(), b1.data(), proj.data(), inp.data(), w.data(), N,
                             C, OC);
    sw::cpu::linear_backward(a2.data(), w2.data(), b2.data(), proj.data(), inp.data(), w.data(), N,
                             C, OC);
    CHECK(same_bits(a1, a2));
    CHECK(same_bits(w1, w2));
    CHECK(same_bits(b1, b2));
  }
}

// ------------------------------------------------------------------------------------------
// Attention

namespace {

struct Attn {
  int B, T, H, KVH, hd;
  int R() const { return (H + 2 * KVH) * hd; }
  size_t nqkv() const { return (size_t)B * T * R(); }
  size_t nout() const { return (size_t)B * T * H * hd; }
  size_t nlse() const { return (size_t)B * H * T; }
};

// Naive double reference: full causal softmax per row. Inputs are fp32 values, math in double.
void attn_ref(const Attn& a, const Vec& qkv, DVec& out, DVec& lse) {
  const int R = a.R(), CO = a.H * a.hd, rep = a.H / a.KVH;
  const double scale = 1.0 / std::sqrt((double)a.hd);
  out.assign(a.nout(), 0.0);
  lse.assign(a.nlse(), 0.0);
  std::vector<double> s(a.T);
  for (int b = 0; b < a.B; ++b)
    for (int h = 0; h < a.H; ++h) {
      const int g = h / rep;
      for (int i = 0; i < a.T; ++i) {
        const float* q = &qkv[((size_t)b * a.T + i) * R + (size_t)h * a.hd];
        double m = -1e300;
        for (int j = 0; j <= i; ++j) {
          const float* k = &qkv[((size_t)b * a.T + j) * R + (size_t)(a.H + g) * a.hd];
          double d = 0;
          for (int c = 0; c < a.hd; ++c) d += (double)q[c] * k[c];
          s[j] = d * scale;
          m = std::max(m, s[j]);
        }
        double l = 0;
        for (int j = 0; j <= i; ++j) l += std::exp(s[j] - m);
        double* o = &out[((size_t)b * a.T + i) * CO + (size_t)h * a.hd];
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - m) / l;
          const float* v = &qkv[((size_t)b * a.T + j) * R + (size_t)(a.H + a.KVH + g) * a.hd];
          for (int c = 0; c < a.hd; ++c) o[c] += p * v[c];
        }
        lse[((size_t)b * a.H + h) * a.T + i] = m + std::log(l);
      }
    }
}

// Up to n indices in each part (q, k, v) of qkv, deterministic.
std::vector<size_t> part_indices(const Attn& a, int part, int n, uint64_t seed) {
  const int width = (part == 0 ? a.H : a.KVH) * a.hd;
  const int off = part == 0 ? 0 : part == 1 ? a.H * a.hd : (a.H + a.KVH) * a.hd;
  sw::Rng rng(seed, part);
  std::vector<size_t> idx;
  for (int s = 0; s < n; ++s) {
    const size_t row = rng.below((uint64_t)a.B * a.T), col = rng.below(width);
    idx.push_back(row * a.R() + off + col);
  }
  return idx;
}

}  // namespace

TEST_CASE("attention forward matches a full-softmax double reference (MHA, GQA, odd T)") {
  sw::set_num_threads(2);
  // T = 300 > the forward key tile (256): exercises the online-softmax rescaling; T = 70 and 65
  // are not multiples of the 64-row query tiles; T = 1 is a single visible key.
  for (Attn a : {Attn{2, 70, 4, 4, 16}, Attn{2, 65, 4, 2, 8}, Attn{1, 37, 4, 1, 32},
                 Attn{1, 300, 2, 1, 16}, Attn{3, 1, 4, 2, 8}, Attn{1, 129, 3, 3, 64}}) {
    const Vec qkv = randv(a.nqkv(), 100 + a.T + a.KVH, 1.0f);
    Vec out(a.nout(), 7.f), lse(a.nlse(), 7.f);
    sw::cpu::attention_forward(out.data(), lse.data(), qkv.data(), a.B, a.T, a.H, a.KVH, a.hd);
    DVec ro, rl;
    attn_ref(a, qkv, ro, rl);
    const double eo = max_abs_diff(out.data(), ro.data(), out.size());
    const double el = max_abs_diff(lse.data(), rl.data(), lse.size());
    REPORT("B=" << a.B << " T=" << a.T << " H=" << a.H << " KVH=" << a.KVH << " hd=" << a.hd
                << ": out err " << eo << ", lse err " << el);
    CHECK(eo < 1e-5);
    CHECK(el < 1e-5);
  }
}

TEST_CASE("attention backward matches finite differences for dq, dk, dv") {
  sw::set_num_threads(2);
  // Double-reference FD (tight) on shapes spanning several backward tiles, with GQA.
  // hd = 8, 4 take the scalar column tails, hd = 16, 64 the vector paths only.
  for (Attn a : {Attn{2, 70, 4, 4, 8}, Attn{1, 130, 4, 2, 8}, Attn{2, 33, 4, 1, 16},
                 Attn{2, 1, 2, 1, 4}, Attn{1, 72, 2, 1, 64}}) {
    Vec qkv = randv(a.nqkv(), 200 + a.T + a.KVH, 1.0f);
    const Vec proj = randv(a.nout(), 300 + a.T);
    Vec out(a.nout()), lse(a.nlse());
    sw::cpu::attention_forward(out.data(), lse.data(), qkv.data(), a.B, a.T, a.H, a.KVH, a.hd);
    Vec dqkv(a.nqkv(), 0.f);
    sw::cpu::attention_backward(dqkv.data(), proj.data(), qkv.data(), out.data(), lse.data(), a.B,
                                a.T, a.H, a.KVH, a.hd);
    auto ref_loss = [&] {
      DVec ro, rl;
      attn_ref(a, qkv, ro, rl);
      double s = 0;
      for (size_t i = 0; i < ro.size(); ++i) s += ro[i] * proj[i];
      return s;
    };
    for (int part = 0; part < 3; ++part) {
      const auto r = fd_at(ref_loss, qkv.data(), dqkv.data(),
                           part_indices(a, part, a.hd == 64 ? 16 : 30, 7), kHRef, 1e-3);
      REPORT("B=" << a.B << " T=" << a.T << " H=" << a.H << " KVH=" << a.KVH << " part="
                  << "qkv"[part] << ": " << r.str());
      CHECK(r.max_err < 2e-4);
    }
  }
  // FD of our own fp32 forward on a tiny GQA shape.
  {
    const Attn a{1, 6, 2, 1, 4};
    Vec qkv = randv(a.nqkv(), 401), proj = randv(a.nout(), 402);
    Vec out(a.nout()), lse(a.nlse()), dqkv(a.nqkv(), 0.f);
    sw::cpu::attention_forward(out.data(), lse.data(), qkv.data(), a.B, a.T, a.H, a.KVH, a.hd);
    sw::cpu::attention_backward(dqkv.data(), proj.data(), qkv.data(), out.data(), lse.data(), a.B,
                                a.T, a.H, a.KVH, a.hd);
    Vec o2(a.nout()), l2(a.nlse());
    auto loss = [&] {
      sw::cpu::attention_forward(o2.data(), l2.data(), qkv.data(), a.B, a.T, a.H, a.KVH, a.hd);
      return swtest::dot(o2.data(), proj.data(), o2.size());
    };
    const auto r = check_grad(loss, qkv.data(), dqkv.data(), qkv.size(), 1000, 1e-2f, 1e-2);
    REPORT("attention fp32 FD: " << r.str());
    CHECK(r.max_err < 1e-2);
  }
}

TEST_CASE("attention backward accumulates (+=) and reruns bit-identically") {
  sw::set_num_threads(2);
  for (Attn a : {Attn{2, 100, 4, 2, 16}, Attn{2, 100, 4, 4, 16}}) {
    const Vec qkv = randv(a.nqkv(), 500 + a.KVH), proj = randv(a.nout(), 501);
    Vec out(a.nout()), lse(a.nlse());
    sw::cpu::attention_forward(out.data(), lse.data(), qkv.data(), a.B, a.T, a.H, a.KVH, a.hd);
    Vec out2(a.nout()), lse2(a.nlse());
    sw::cpu::attention_forward(out2.data(), lse2.data(), qkv.data(), a.B, a.T, a.H, a.KVH, a.hd);
    CHECK(same_bits(out, out2));
    CHECK(same_bits(lse, lse2));

    Vec g0(a.nqkv(), 0.f), g1(a.nqkv(), 0.f);
    sw::cpu::attention_backward(g0.data(), proj.data(), qkv.data(), out.data(), lse.data(), a.B,
                                a.T, a.H, a.KVH, a.hd);
    sw::cpu::attention_backward(g1.data(), proj.data(), qkv.data(), out.data(), lse.data(), a.B,
                                a.T, a.H, a.KVH, a.hd);
    CHECK(same_bits(g0, g1));

    const Vec pre = randv(a.nqkv(), 502);
    Vec g = pre;
    sw::cpu::attention_backward(g.data(), proj.data(), qkv.data(), out.data(), lse.data(), a.B, a.T,
                                a.H, a.KVH, a.hd);
    double err = 0;
    for (size_t i = 0; i < g.size(); ++i)
      err = std::max(err, std::fabs(g[i] - ((double)pre[i] + g0[i])) / (1.0 + std::fabs(g0[i])));
    REPORT("KVH=" << a.KVH << " worst deviation from prefill + gradient: " << err);
    CHECK(err < 2e-6);  // measured ~2e-7: one extra rounding per element
  }
}

// ------------------------------------------------------------------------------------------
// LM head + cross-entropy

namespace {

// Per-row loss in double (full logits, log-softmax); ignored rows give 0.
DVec xent_ref(const Vec& x, const Vec& w, const std::vector<int32_t>& tg, int N, int C, int V) {
  DVec loss(N, 0.0), lg(V);
  for (int n = 0; n < N; ++n) {
    if (tg[n] < 0) continue;
    double m = -1e300;
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += (double)x[(size_t)n * C + c] * w[(size_t)v * C + c];
      lg[v] = s;
      m = std::max(m, s);
    }
    double l = 0;
    for (int v = 0; v < V; ++v) l += std::exp(lg[v] - m);
    loss[n] = m + std::log(l) - lg[tg[n]];
  }
  return loss;
}

std::vector<int32_t> make_targets(int N, int V, uint64_t seed) {
  sw::Rng rng(seed);
  std::vector<int32_t> t(N);
  for (int n = 0; n < N; ++n) t[n] = (n % 7 == 3) ? -1 : (int32_t)rng.below(V);  // some ignored
  return t;
}

}  // namespace

TEST_CASE("lmhead_xent loss matches full logits + log-softmax, ignored targets, eval mode") {
  sw::set_num_threads(2);
  // N = 600 > the 512-row chunk and not a multiple of it.
  for (auto [N, C, V] : {std::tuple{600, 24, 97}, std::tuple{5, 16, 1000}, std::tuple{1, 8, 3}}) {
    const Vec x = randv((size_t)N * C, 600 + N, 0.5f), w = randv((size_t)V * C, 601 + V, 0.5f);
    const auto tg = make_targets(N, V, 602);
    const DVec ref = xent_ref(x, w, tg, N, C, V);
    Vec loss(N, 9.f);
    const double total = sw::cpu::lmhead_xent(loss.data(), nullptr, nullptr, x.data(), w.data(),
                                              tg.data(), N, C, V, 1.f);
    double rtot = 0;
    for (double v : ref) rtot += v;
    const double el = max_abs_diff(loss.data(), ref.data(), N);
    REPORT("N=" << N << " C=" << C << " V=" << V << ": loss err " << el);
    // Logits carry <= C u sum|xw| ~ 1e-6 error, the row's lse and loss a few times that.
    CHECK(el < 5e-6);  // measured <= 6e-7
    CHECK(std::fabs(total - rtot) < 5e-6 * N);
    for (int n = 0; n < N; ++n)
      if (tg[n] < 0) CHECK(loss[n] == 0.f);
  }
}

TEST_CASE("lmhead_xent gradients: finite differences, +=, null outputs, grad_scale, reruns") {
  sw::set_num_threads(2);
  const int N = 600, C = 24, V = 97;  // two chunks (512 + 88 rows)
  Vec x = randv((size_t)N * C, 700, 0.5f), w = randv((size_t)V * C, 701, 0.5f);
  const auto tg = make_targets(N, V, 702);
  const float gs = 0.3f;
  Vec loss(N), dx((size_t)N * C, 0.f), dw((size_t)V * C, 0.f);
  const double tot = sw::cpu::lmhead_xent(loss.data(), dx.data(), dw.data(), x.data(), w.data(),
                                          tg.data(), N, C, V, gs);

  // FD of gs * sum(loss) through the double reference.
  auto ref_loss = [&] {
    double s = 0;
    for (double v : xent_ref(x, w, tg, N, C, V)) s += v;
    return gs * s;
  };
  for (auto [name, xv, g] : {std::tuple{"dx", &x, &dx}, std::tuple{"dw", &w, &dw}}) {
    const auto r = check_grad(ref_loss, xv->data(), g->data(), xv->size(), 24, kHRef, 1e-3);
    REPORT(name << ": " << r.str());
    CHECK(r.max_err < 2e-4);
  }
  // Ignored rows get no gradient.
  for (int n = 0; n < N; ++n)
    if (tg[n] < 0)
      for (int c = 0; c < C; ++c) CHECK(dx[(size_t)n * C + c] == 0.f);

  // Eval mode and one-sided gradients give the same loss; the loss does not depend on them.
  {
    Vec l2(N);
    const double t2 = sw::cpu::lmhead_xent(l2.data(), nullptr, nullptr, x.data(), w.data(),
                                           tg.data(), N, C, V, gs);
    CHECK(t2 == tot);
    CHECK(same_bits(l2, loss));
    Vec dx2((size_t)N * C, 0.f), dw2((size_t)V * C, 0.f);
    sw::cpu::lmhead_xent(nullptr, dx2.data(), nullptr, x.data(), w.data(), tg.data(), N, C, V, gs);
    sw::cpu::lmhead_xent(nullptr, nullptr, dw2.data(), x.data(), w.data(), tg.data(), N, C, V, gs);
    CHECK(same_bits(dx2, dx));
    CHECK(same_bits(dw2, dw));
  }

  // grad_scale is exactly linear for powers of two; += onto prefilled buffers.
  {
    Vec dx1((size_t)N * C, 0.f), dw1((size_t)V * C, 0.f), dx4 = dx1, dw4 = dw1;
    sw::cpu::lmhead_xent(nullptr, dx1.data(), dw1.data(), x.data(), w.data(), tg.data(), N, C, V,
                         1.f);
    sw::cpu::lmhead_xent(nullptr, dx4.data(), dw4.data(), x.data(), w.data(), tg.data(), N, C, V,
                         0.25f);
    int bad = 0;
    for (size_t i = 0; i < dx1.size(); ++i) bad += dx4[i] != 0.25f * dx1[i];
    for (size_t i = 0; i < dw1.size(); ++i) bad += dw4[i] != 0.25f * dw1[i];
    CHECK(bad == 0);

    const Vec px = randv(dx.size(), 703), pw = randv(dw.size(), 704);
    Vec ax = px, aw = pw;
    sw::cpu::lmhead_xent(nullptr, ax.data(), aw.data(), x.data(), w.data(), tg.data(), N, C, V, gs);
    double err = 0;
    for (size_t i = 0; i < ax.size(); ++i)
      err = std::max(err, std::fabs(ax[i] - ((double)px[i] + dx[i])) / (1.0 + std::fabs(dx[i])));
    for (size_t i = 0; i < aw.size(); ++i)
      err = std::max(err, std::fabs(aw[i] - ((double)pw[i] + dw[i])) / (1.0 + std::fabs(dw[i])));
    REPORT("lmhead worst deviation from prefill + gradient: " << err);
    CHECK(err < 2e-6);  // measured ~2e-7: one extra rounding per element
  }

  // Bit-identical reruns.
  {
    Vec dx2((size_t)N * C, 0.f), dw2((size_t)V * C, 0.f), l2(N);
    const double t2 = sw::cpu::lmhead_xent(l2.data(), dx2.data(), dw2.data(), x.data(), w.data(),
                                           tg.data(), N, C, V, gs);
    CHECK(t2 == tot);
    CHECK(same_bits(dx2, dx));
    CHECK(same_bits(dw2, dw));
  }

  // FD of our own fp32 forward on a tiny shape.
  {
    const int n = 4, c = 5, v = 11;
    Vec xs = randv((size_t)n * c, 710, 0.5f), ws = randv((size_t)v * c, 711, 0.5f);
    const std::vector<int32_t> t{3, -1, 10, 0};
    Vec gx((size_t)n * c, 0.f), gw((size_t)v * c, 0.f);
    sw::cpu::lmhead_xent(nullptr, gx.data(), gw.data(), xs.data(), ws.data(), t.data(), n, c, v,
                         gs);
    auto loss_f = [&] {
      return gs * sw::cpu::lmhead_xent(nullptr, nullptr, nullptr, xs.data(), ws.data(), t.data(), n,
                                       c, v, gs);
    };
    for (auto [name, xv, g] : {std::tuple{"dx", &xs, &gx}, std::tuple{"dw", &ws, &gw}}) {
      const auto r = check_grad(loss_f, xv->data(), g->data(), xv->size(), 100, 1e-2f, 1e-2);
      REPORT(name << " (fp32 FD): " << r.str());
      CHECK(r.max_err < 1e-2);
    }
  }
}
