// Reduced-precision compute (ops_for(cpu, BF16 / F16)): every op that changes against fp32
// (gemm, linear, attention, fused LM head) checked two ways, plus the ops that must not change.
//
// (a) Against a double-precision reference computed on operands ROUNDED the same way
//     (core/dtype.h f32_to_bf16 / f32_to_f16). Products of rounded values are exact in fp32,
//     so the only error left is fp32 accumulation: the proven bound
//     (K + 2) u (|alpha| sum_k |a_k b_k| + |beta c|), u = 2^-24, applies. Where an operand is
//     itself formed in fp32 inside the kernel before rounding (attention's P and dS, the LM
//     head's dlogits) the kernel and the reference may round a value on either side of a
//     rounding boundary, so those terms get one unit of the low precision more:
//     u_low * sum |terms| (u_low = 2^-8 bf16, 2^-11 fp16).
// (b) Against the fp32 ops, with the error the rounding itself makes: each product of two
//     rounded operands is within (2 u_low + u_low^2) |a b| of the exact one, so
//     |C_low - C_f32| <= (2 u_low + u_low^2 + 2 (K + 2) u) sum |a b| (proven); for attention
//     and the LM head (exp, normalisation) documented measured tolerances instead.
// Plus: the native (AVX512-BF16), fused (AVX-512 FMA) and emulated (rounded copies + sgemm)
// paths agree (same products, other summation orders: within twice the fp32 bound);
// rounding is exactly f32_to_bf16 / f32_to_f16 (a product with the identity returns the
// rounded operand; round_to bit for bit on random bit patterns); fp16 overflow gives inf;
// bit-identical reruns (and, for the packed native/fused GEMMs, 1 vs 2 threads). The oneDNN
// path runs every path test above and is also compared with the emulated path to the
// accumulation order (a few sqrt(K) fp32 epsilons); Auto's per-shape choice runs one of the
// two paths bit for bit and leaves C as one call would (its timing runs use copies).
// Attention in bf16 on vdpbf16ps (where the CPU has it) is checked by (a) and against its
// FMA path (set_attention_bf16_native(false)) at the step's shapes and at edge shapes, with
// 16-bit operands read in place giving the bits of fp32 ones, and 1 vs 2 threads.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using sw::DType;
using sw::cpu::LowpPath;
using swtest::DVec;
using swtest::gemm_ref;
using swtest::kU;
using swtest::randv;
using swtest::same_bits;
using swtest::Vec;

double u_low(DType t) { return t == DType::BF16 ? 1.0 / 256 : 1.0 / 2048; }

float rnd(DType t, float x) {
  return t == DType::BF16 ? sw::bf16_to_f32(sw::f32_to_bf16(x))
                          : sw::f16_to_f32(sw::f32_to_f16(x));
}
Vec rounded(DType t, const Vec& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = rnd(t, v[i]);
  return r;
}

// Equal as numbers (+0 == -0: a sum of exact zeros may turn a rounded -0 into +0).
bool same_values(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) return false;
  return true;
}

struct Case {
  int M, N, K;
};
// Odd sizes: not multiples of the microkernel tile (6 x 64), of the K block (192) or of 16;
// K odd (a zero-padded last pair); one case spanning several K and M blocks.
const std::vector<Case> kCases = {{1, 1, 1},    {7, 5, 3},     {13, 70, 33},
                                  {67, 129, 65}, {6, 64, 192}, {150, 200, 385}};

std::vector<std::pair<DType, LowpPath>> paths() {
  std::vector<std::pair<DType, LowpPath>> p = {{DType::BF16, LowpPath::Emulated},
                                               {DType::BF16, LowpPath::Auto},
                                               {DType::F16, LowpPath::Emulated},
                                               {DType::F16, LowpPath::Auto}};
  if (sw::cpu::cpu_has_avx512_bf16()) p.push_back({DType::BF16, LowpPath::Native});
  if (sw::cpu::cpu_has_avx512()) {
    p.push_back({DType::BF16, LowpPath::Fused});
    p.push_back({DType::F16, LowpPath::Fused});
    p.push_back({DType::BF16, LowpPath::OneDnn});
  }
  return p;
}

const char* path_name(LowpPath p) {
  return p == LowpPath::Native     ? "native"
         : p == LowpPath::Fused    ? "fused"
         : p == LowpPath::Emulated ? "emulated"
         : p == LowpPath::OneDnn   ? "onednn"
                                   : "auto";
}

}  // namespace

TEST_CASE("bf16/fp16 gemm = double reference on rounded operands, all transposes, alpha/beta") {
  for (auto [t, path] : paths())
    for (const Case& cs : kCases)
      for (int tr = 0; tr < 4; ++tr)
        for (auto [alpha, beta] : {std::pair{1.f, 0.f}, {-0.5f, 1.f}, {1.5f, 0.75f}}) {
          const bool ta = tr & 1, tb = tr & 2;
          const int M = cs.M, N = cs.N, K = cs.K;
          const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
          const Vec A = randv((size_t)(ta ? K : M) * lda, 11 + M);
          const Vec B = randv((size_t)(tb ? N : K) * ldb, 23 + N);
          const Vec C0 = randv((size_t)M * ldc, 37 + K);
          Vec C = C0;
          sw::cpu::gemm_lowp(t, ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta,
                             C.data(), ldc, path);
          DVec ref, sabs;
          gemm_ref(ta, tb, M, N, K, alpha, rounded(t, A), lda, rounded(t, B), ldb, beta, C0, ldc,
                   ref, sabs);
          double worst = 0;  // error / bound
          bool pad_ok = true;
          for (int i = 0; i < M; ++i) {
            for (int j = 0; j < N; ++j) {
              const size_t x = (size_t)i * ldc + j;
              worst = std::max(worst, std::fabs(C[x] - ref[x]) / ((K + 2) * kU * sabs[x] + 1e-30));
            }
            for (int j = N; j < ldc; ++j)
              pad_ok &= C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j];
          }
          REPORT(sw::dtype_name(t) << " " << path_name(path) << " M" << M << " N" << N << " K" << K
                                   << " ta" << ta << " tb" << tb << " alpha " << alpha << " beta "
                                   << beta << ": error / fp32 bound " << worst);
          CHECK(worst <= 1.0);
          CHECK(pad_ok);  // columns beyond N (ldc padding) untouched
        }
}

TEST_CASE("bf16/fp16 gemm vs fp32 gemm: within the rounding bound") {
  for (auto [t, path] : paths())
    for (int tr = 0; tr < 4; ++tr) {
      const bool ta = tr & 1, tb = tr & 2;
      const int M = 70, N = 90, K = 333;
      const Vec A = randv((size_t)M * K, 5), B = randv((size_t)K * N, 6);
      const int lda = ta ? M : K, ldb = tb ? K : N;
      Vec Cl((size_t)M * N), Cf((size_t)M * N);
      sw::cpu::gemm_lowp(t, ta, tb, M, N, K, 1.f, A.data(), lda, B.data(), ldb, 0.f, Cl.data(), N,
                         path);
      sw::cpu::gemm(ta, tb, M, N, K, 1.f, A.data(), lda, B.data(), ldb, 0.f, Cf.data(), N);
      DVec ref, sabs;
      gemm_ref(ta, tb, M, N, K, 1.f, A, lda, B, ldb, 0.f, Vec((size_t)M * N), N, ref, sabs);
      const double ul = u_low(t), f = 2 * ul + ul * ul + 2 * (K + 2) * kU;
      double worst = 0, se = 0, sr = 0;
      for (size_t x = 0; x < Cl.size(); ++x) {
        worst = std::max(worst, std::fabs(Cl[x] - Cf[x]) / (f * sabs[x]));
        se += (Cl[x] - Cf[x]) * (Cl[x] - Cf[x]);
        sr += Cf[x] * Cf[x];
      }
      const double rel_rms = std::sqrt(se / sr);
      REPORT(sw::dtype_name(t) << " " << path_name(path) << " ta" << ta << " tb" << tb
                               << ": |low - f32| / bound " << worst << ", rms rel error "
                               << rel_rms);
      CHECK(worst <= 1.0);
      // Rounding errors of random sign: ~u_low/sqrt(3) per operand relative, not 2 u_low.
      CHECK(rel_rms < ul);
      CHECK(rel_rms > 0);  // the operands were rounded
    }
}

TEST_CASE("rounding is exactly f32_to_bf16 / f32_to_f16 on every path") {
  // C = A @ I returns op(A) rounded, bit for bit (one exact product and exact zeros per entry).
  std::vector<float> specials = {1.0f + 1.0f / 256,  // tie: rounds to even (1.0) in bf16
                                 1.0f + 3.0f / 256,  // tie: rounds up to 1 + 2^-6
                                 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,  // fp16 ties
                                 -3.14159f, 65504.f, 65519.f, 1e-3f, -2.5e-5f,
                                 3.0e38f, -1.0e-30f, 0.f, -0.f};
  Vec A = randv(16 * 40, 99, 100.f);
  for (size_t i = 0; i < specials.size(); ++i) A[i * 3] = specials[i];
  for (auto [t, path] : paths()) {
    Vec a = A;
    if (t == DType::F16)  // keep fp16 finite here (overflow has its own test)
      for (float& v : a) v = std::clamp(v, -60000.f, 60000.f);
    for (int ta = 0; ta < 2; ++ta) {
      const int M = 16, K = 40;
      Vec I((size_t)K * K, 0.f), C((size_t)M * K);
      for (int k = 0; k < K; ++k) I[(size_t)k * K + k] = 1.f;
      Vec src = a;  // (M, K) or its transpose (K, M)
      if (ta)
        for (int i = 0; i < M; ++i)
          for (int k = 0; k < K; ++k) src[(size_t)k * M + i] = a[(size_t)i * K + k];
      sw::cpu::gemm_lowp(t, ta, false, M, K, K, 1.f, src.data(), ta ? M : K, I.data(), K, 0.f,
                         C.data(), K, path);
      INFO(sw::dtype_name(t) << " " << path_name(path) << " ta " << ta);
      CHECK(same_values(C, rounded(t, a)));
      // The B side: C = I @ op(B) with op(B) = a^T (K, M); tb reads a itself as (M, K).
      Vec at((size_t)K * M), expect((size_t)K * M);
      for (int i = 0; i < M; ++i)
        for (int k = 0; k < K; ++k) {
          at[(size_t)k * M + i] = a[(size_t)i * K + k];
          expect[(size_t)k * M + i] = rnd(t, a[(size_t)i * K + k]);
        }
      Vec C2((size_t)K * M);
      const bool tb = ta;
      sw::cpu::gemm_lowp(t, false, tb, K, M, K, 1.f, I.data(), K, tb ? a.data() : at.data(),
                         tb ? K : M, 0.f, C2.data(), M, path);
      CHECK(same_values(C2, expect));
    }
  }
}

TEST_CASE("fp16 overflow gives inf, bf16 keeps the value") {
  const float big = 70000.f;  // > 65504: +inf in fp16, 70144 in bf16
  for (auto [t, path] : paths()) {
    Vec A = {big, 1.f, 1.f, 2.f}, B = {1.f, 1.f, 1.f, 1.f}, C(4);
    sw::cpu::gemm_lowp(t, false, false, 2, 2, 2, 1.f, A.data(), 2, B.data(), 2, 0.f, C.data(), 2,
                       path);
    INFO(sw::dtype_name(t) << " " << path_name(path));
    if (t == DType::F16) {
      CHECK(std::isinf(C[0]));
      CHECK(C[0] > 0);
      CHECK(C[2] == 3.f);  // finite rows stay exact
    } else {
      CHECK(std::isfinite(C[0]));
      CHECK(C[2] == 3.f);
    }
  }
  // A loss scale too large for fp16: a product whose operands are finite in fp32 but not in
  // fp16 must show up as non-finite output (what the dynamic loss scaler looks for).
  const sw::Ops& f16 = sw::ops_for(sw::Device::cpu(), DType::F16);
  Vec x = {1e5f, 1.f}, w = {1.f, 1.f}, out(1);
  f16.linear_forward(out.data(), x.data(), w.data(), nullptr, nullptr, 1, 2, 1);
  CHECK(std::isinf(out[0]));
}

TEST_CASE("native, fused and emulated bf16 agree: reruns are bit-identical") {
  for (int tr = 0; tr < 4; ++tr) {
    const bool ta = tr & 1, tb = tr & 2;
    const int M = 131, N = 275, K = 401;
    const Vec A = randv((size_t)M * K, 71), B = randv((size_t)K * N, 72);
    const int lda = ta ? M : K, ldb = tb ? K : N;
    auto run = [&](LowpPath path) {
      Vec C((size_t)M * N, 0.5f);
      sw::cpu::gemm_lowp(DType::BF16, ta, tb, M, N, K, 1.f, A.data(), lda, B.data(), ldb, 1.f,
                         C.data(), N, path);
      return C;
    };
    const Vec e1 = run(LowpPath::Emulated), e2 = run(LowpPath::Emulated);
    CHECK(same_bits(e1, e2));
    DVec ref, sabs;
    gemm_ref(ta, tb, M, N, K, 1.f, rounded(DType::BF16, A), lda, rounded(DType::BF16, B), ldb,
             1.f, Vec((size_t)M * N, 0.5f), N, ref, sabs);
    for (LowpPath p : {LowpPath::Native, LowpPath::Fused}) {
      if (p == LowpPath::Native ? !sw::cpu::cpu_has_avx512_bf16() : !sw::cpu::cpu_has_avx512())
        continue;
      const Vec n1 = run(p), n2 = run(p);
      CHECK(same_bits(n1, n2));
      // The packed kernels give each C element to one thread with a fixed K blocking, so the
      // result does not depend on the thread count either.
      const int nt = omp_get_max_threads();
      omp_set_num_threads(1);
      const Vec n_one = run(p);
      omp_set_num_threads(nt);
      CHECK(same_bits(n1, n_one));
      double worst = 0;
      for (size_t x = 0; x < n1.size(); ++x)
        worst = std::max(worst, std::fabs(n1[x] - e1[x]) / (2 * (K + 2) * kU * sabs[x]));
      REPORT(path_name(p) << " ta" << ta << " tb" << tb
                          << ": |path - emulated| / (2 x fp32 bound) " << worst);
      CHECK(worst <= 1.0);
    }
  }
}

TEST_CASE("oneDNN bf16 path = emulated (rounded copies + sgemm) to fp32 summation order") {
  if (!sw::cpu::cpu_has_avx512()) return;  // the oneDNN path converts with AVX-512
  // Random and odd shapes (the kCases, plus several of oneDNN's blocks in every dimension),
  // all transposes, overwrite (beta 0) and accumulate (beta 1), padded leading dimensions.
  std::vector<Case> cases = kCases;
  cases.push_back({131, 275, 401});
  cases.push_back({300, 520, 1100});
  for (const Case& cs : cases)
    for (int tr = 0; tr < 4; ++tr)
      for (float beta : {0.f, 1.f}) {
        const bool ta = tr & 1, tb = tr & 2;
        const int M = cs.M, N = cs.N, K = cs.K;
        const int lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 3, ldc = N + 1;
        const Vec A = randv((size_t)(ta ? K : M) * lda, 5 + M + tr);
        const Vec B = randv((size_t)(tb ? N : K) * ldb, 7 + N + tr);
        const Vec C0 = randv((size_t)M * ldc, 9 + K);
        auto run = [&](LowpPath p) {
          Vec C = C0;
          sw::cpu::gemm_lowp(DType::BF16, ta, tb, M, N, K, 1.f, A.data(), lda, B.data(), ldb,
                             beta, C.data(), ldc, p);
          return C;
        };
        const Vec e = run(LowpPath::Emulated), o1 = run(LowpPath::OneDnn),
                  o2 = run(LowpPath::OneDnn);
        CHECK(same_bits(o1, o2));  // reruns at a fixed thread count are bit-identical
        DVec ref, sabs;
        gemm_ref(ta, tb, M, N, K, 1.f, rounded(DType::BF16, A), lda, rounded(DType::BF16, B),
                 ldb, beta, C0, ldc, ref, sabs);
        // The same exact products summed in another order: errors of random sign grow like
        // sqrt(K) fp32 epsilons (the proven worst case is K + 2 unit roundoffs; a few sqrt(K)
        // epsilons is what a different blocking of the sum gives in practice).
        const double eps = 2 * kU;
        double worst = 0, se = 0, sr = 0;
        bool pad_ok = true;
        for (int i = 0; i < M; ++i) {
          for (int j = 0; j < N; ++j) {
            const size_t x = (size_t)i * ldc + j;
            worst = std::max(worst, std::fabs(o1[x] - e[x]) / (std::sqrt(K + 2.0) * eps * sabs[x] + 1e-30));
            se += (o1[x] - e[x]) * (o1[x] - e[x]);
            sr += sabs[x] * sabs[x];
          }
          for (int j = N; j < ldc; ++j) pad_ok &= o1[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j];
        }
        const double rel_rms = std::sqrt(se / (sr + 1e-300));
        REPORT("onednn M" << M << " N" << N << " K" << K << " ta" << ta << " tb" << tb << " beta "
                          << beta << ": max |onednn - emulated| / (sqrt(K+2) eps sum|ab|) "
                          << worst << ", rms " << rel_rms / (std::sqrt(K + 2.0) * eps));
        CHECK(worst <= 4.0);
        CHECK(rel_rms <= std::sqrt(K + 2.0) * eps);
        CHECK(pad_ok);
      }
}

// Run by ctest as bf16_tuned_choice with SHARDWISE_LOWP_PATH=tuned (Auto's default is a fixed
// rule).
TEST_CASE("Tuned per-shape choice: measured once, then one of the two paths bit for bit",
          "[.tuned]") {
  if (!sw::cpu::cpu_has_avx512()) return;  // no oneDNN path to choose
  REQUIRE(sw::cpu::lowp_per_shape(DType::BF16));
  const int M = 96, N = 200, K = 160;
  const Vec A = randv((size_t)M * K, 81), B = randv((size_t)K * N, 82);
  CHECK(sw::cpu::lowp_shape_choice(false, true, M, N, K) == LowpPath::Auto);  // not called yet
  auto run = [&](LowpPath p) {
    Vec C((size_t)M * N, 0.25f);
    sw::cpu::gemm_lowp(DType::BF16, false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 1.f,
                       C.data(), N, p);
    return C;
  };
  const Vec a1 = run(LowpPath::Auto);  // measures (on scratch copies of C) and runs the choice
  double t_own = 0, t_dnn = 0;
  LowpPath own = LowpPath::Auto;
  const LowpPath ch = sw::cpu::lowp_shape_choice(false, true, M, N, K, &t_own, &t_dnn, &own);
  REPORT("choice " << path_name(ch) << ", own (" << path_name(own) << ") " << t_own * 1e3
                   << " ms, onednn " << t_dnn * 1e3 << " ms");
  // The own kernel timed is ours (vdpbf16ps where bf16 runs it, else FMA), not oneDNN: Auto's
  // path is oneDNN on such CPUs, and timing it against itself chose nothing.
  CHECK(own == sw::cpu::lowp_own_path(DType::BF16));
  CHECK(own == (sw::cpu::bf16_native() ? LowpPath::Native : LowpPath::Fused));
  CHECK((ch == LowpPath::OneDnn || ch == own));
  CHECK(t_own > 0);
  CHECK(t_dnn > 0);
  CHECK(same_bits(a1, run(ch)));  // beta = 1 applied once: the measurement ran on copies
  CHECK(same_bits(a1, run(LowpPath::Auto)));
  CHECK(sw::cpu::lowp_shape_choice(false, true, M, N, K) == ch);  // kept for the process
}

TEST_CASE("linear forward/backward in bf16/fp16 = double reference on rounded operands") {
  for (DType t : {DType::BF16, DType::F16}) {
    const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), t);
    const sw::Ops& f32 = sw::ops_for(sw::Device::cpu());
    const int N = 37, C = 45, OC = 29;
    const Vec x = randv((size_t)N * C, 1), w = randv((size_t)OC * C, 2), b = randv(OC, 3);
    const Vec dout = randv((size_t)N * OC, 4);
    Vec out((size_t)N * OC);
    ops.linear_forward(out.data(), x.data(), w.data(), b.data(), nullptr, N, C, OC);
    const Vec xr = rounded(t, x), wr = rounded(t, w), dr = rounded(t, dout);
    double worst = 0;
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) {
        double s = b[o], sa = std::fabs(b[o]);
        for (int c = 0; c < C; ++c) {
          s += (double)xr[(size_t)n * C + c] * wr[(size_t)o * C + c];
          sa += std::fabs((double)xr[(size_t)n * C + c] * wr[(size_t)o * C + c]);
        }
        worst = std::max(worst, std::fabs(out[(size_t)n * OC + o] - s) / ((C + 2) * kU * sa));
      }
    // Backward accumulates into prefilled buffers.
    const Vec dx0 = randv((size_t)N * C, 5), dw0 = randv((size_t)OC * C, 6), db0 = randv(OC, 7);
    Vec dx = dx0, dw = dw0, db = db0, db32 = db0;
    ops.linear_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C,
                        OC);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) {
        double s = dx0[(size_t)n * C + c], sa = std::fabs(s);
        for (int o = 0; o < OC; ++o) {
          const double p = (double)dr[(size_t)n * OC + o] * wr[(size_t)o * C + c];
          s += p, sa += std::fabs(p);
        }
        worst = std::max(worst, std::fabs(dx[(size_t)n * C + c] - s) / ((OC + 2) * kU * sa));
      }
    for (int o = 0; o < OC; ++o)
      for (int c = 0; c < C; ++c) {
        double s = dw0[(size_t)o * C + c], sa = std::fabs(s);
        for (int n = 0; n < N; ++n) {
          const double p = (double)dr[(size_t)n * OC + o] * xr[(size_t)n * C + c];
          s += p, sa += std::fabs(p);
        }
        worst = std::max(worst, std::fabs(dw[(size_t)o * C + c] - s) / ((N + 2) * kU * sa));
      }
    REPORT(sw::dtype_name(t) << " linear: error / fp32 bound " << worst);
    CHECK(worst <= 1.0);
    // The bias gradient is a plain fp32 sum: the fp32 op's bits.
    f32.linear_backward(nullptr, nullptr, db32.data(), dout.data(), x.data(), w.data(), N, C, OC);
    CHECK(same_bits(db, db32));
  }
}

TEST_CASE("ops_for(cpu, BF16/F16): products change, element-wise ops and norms do not") {
  const sw::Ops& f32 = sw::ops_for(sw::Device::cpu());
  CHECK(&sw::ops_for(sw::Device::cpu(), DType::F32) == &f32);
  const int N = 9, C = 40;
  const Vec x = randv((size_t)N * C, 8), w = randv(C, 9), b = randv(C, 10);
  for (DType t : {DType::BF16, DType::F16}) {
    const sw::Ops& lo = sw::ops_for(sw::Device::cpu(), t);
    CHECK(&lo != &f32);
    CHECK(lo.device().is_cpu());
    Vec o1((size_t)N * C), o2((size_t)N * C), m1(N), m2(N), r1(N), r2(N);
    lo.layernorm_forward(o1.data(), m1.data(), r1.data(), x.data(), w.data(), b.data(), N, C);
    f32.layernorm_forward(o2.data(), m2.data(), r2.data(), x.data(), w.data(), b.data(), N, C);
    CHECK(same_bits(o1, o2));
    lo.gelu_forward(o1.data(), x.data(), x.size());
    f32.gelu_forward(o2.data(), x.data(), x.size());
    CHECK(same_bits(o1, o2));
    // gemm: the op is gemm_lowp on its dtype (Auto path), bit for bit.
    Vec c1((size_t)N * N), c2((size_t)N * N), c3((size_t)N * N);
    lo.gemm(false, true, N, N, C, 1.f, x.data(), C, x.data(), C, 0.f, c1.data(), N);
    sw::cpu::gemm_lowp(t, false, true, N, N, C, 1.f, x.data(), C, x.data(), C, 0.f, c2.data(), N);
    f32.gemm(false, true, N, N, C, 1.f, x.data(), C, x.data(), C, 0.f, c3.data(), N);
    CHECK(same_bits(c1, c2));
    CHECK(!same_bits(c1, c3));
  }
}

namespace {

// Double reference of the fused LM head on rounded x, w: per-row loss, and the gradients with
// dlogits rounded as the kernel does. sab* = sum of |terms| per output element (for bounds).
struct LmRef {
  DVec loss, dx, dw, sdx, sdw, slogit;
};
LmRef lmhead_ref(DType t, const Vec& x, const Vec& w, const std::vector<int32_t>& tg, int N,
                 int C, int V, float gs) {
  const Vec xr = rounded(t, x), wr = rounded(t, w);
  LmRef r;
  r.loss.assign(N, 0), r.dx.assign((size_t)N * C, 0), r.dw.assign((size_t)V * C, 0);
  r.sdx.assign((size_t)N * C, 0), r.sdw.assign((size_t)V * C, 0), r.slogit.assign(N, 0);
  for (int n = 0; n < N; ++n) {
    DVec lg(V);
    double mx = -1e300, sl = 0;
    for (int v = 0; v < V; ++v) {
      double s = 0, sa = 0;
      for (int c = 0; c < C; ++c) {
        const double p = (double)xr[(size_t)n * C + c] * wr[(size_t)v * C + c];
        s += p, sa += std::fabs(p);
      }
      lg[v] = s, mx = std::max(mx, s), sl = std::max(sl, sa);
    }
    r.slogit[n] = sl;
    if (tg[n] < 0) continue;
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(lg[v] - mx);
    r.loss[n] = mx + std::log(z) - lg[tg[n]];
    for (int v = 0; v < V; ++v) {
      double d = gs * std::exp(lg[v] - mx) / z - (v == tg[n] ? gs : 0.0);
      const float dl = rnd(t, (float)d);
      for (int c = 0; c < C; ++c) {
        r.dx[(size_t)n * C + c] += (double)dl * wr[(size_t)v * C + c];
        r.sdx[(size_t)n * C + c] += std::fabs((double)dl * wr[(size_t)v * C + c]);
        r.dw[(size_t)v * C + c] += (double)dl * xr[(size_t)n * C + c];
        r.sdw[(size_t)v * C + c] += std::fabs((double)dl * xr[(size_t)n * C + c]);
      }
    }
  }
  return r;
}

}  // namespace

TEST_CASE("LM head + cross-entropy in bf16/fp16 vs rounded-operand reference and fp32") {
  const int N = 21, C = 24, V = 77;
  const float gs = 0.5f;
  const Vec x = randv((size_t)N * C, 31), w = randv((size_t)V * C, 32, 0.3f);
  std::vector<int32_t> tg(N);
  for (int n = 0; n < N; ++n) tg[n] = n == 4 ? -1 : (n * 13) % V;
  const sw::Ops& f32 = sw::ops_for(sw::Device::cpu());
  Vec loss32(N), dx32((size_t)N * C), dw32((size_t)V * C);
  const double tot32 = f32.lmhead_xent(loss32.data(), dx32.data(), dw32.data(), x.data(),
                                       w.data(), tg.data(), N, C, V, gs);
  for (DType t : {DType::BF16, DType::F16}) {
    const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), t);
    Vec loss(N), dx((size_t)N * C), dw((size_t)V * C);
    const double tot = ops.lmhead_xent(loss.data(), dx.data(), dw.data(), x.data(), w.data(),
                                       tg.data(), N, C, V, gs);
    const LmRef r = lmhead_ref(t, x, w, tg, N, C, V, gs);
    // (a) loss: logits carry the fp32 bound (C+2) u sum|xw| each; the loss moves by at most
    // twice the largest logit error (lse and the target logit), plus exp_approx's ~2 ulp.
    double wl = 0, wx = 0, ww = 0;
    for (int n = 0; n < N; ++n)
      wl = std::max(wl, std::fabs(loss[n] - r.loss[n]) /
                            (2 * (C + 2) * kU * r.slogit[n] + 1e-6 * (1 + std::fabs(r.loss[n]))));
    // gradients: dlogits may round to the neighbouring value (one u_low of each term).
    const double ul = u_low(t);
    for (size_t i = 0; i < dx.size(); ++i)
      wx = std::max(wx, std::fabs(dx[i] - r.dx[i]) / (ul * r.sdx[i] + 1e-7));
    for (size_t i = 0; i < dw.size(); ++i)
      ww = std::max(ww, std::fabs(dw[i] - r.dw[i]) / (ul * r.sdw[i] + 1e-7));
    CHECK(loss[4] == 0.f);
    REPORT(sw::dtype_name(t) << " lmhead: loss err/bound " << wl << ", dx " << wx << ", dw "
                             << ww);
    CHECK(wl <= 1.0);
    CHECK(wx <= 1.0);
    CHECK(ww <= 1.0);
    // (b) against fp32: measured relative differences (bf16 ~4e-3, fp16 ~5e-4 of the largest
    // gradient); tolerance 4 u_low relative to the largest magnitude.
    double dl = 0, mdx = 0, mdw = 0, ex = 0, ew = 0;
    for (int n = 0; n < N; ++n) dl = std::max(dl, (double)std::fabs(loss[n] - loss32[n]));
    for (size_t i = 0; i < dx.size(); ++i)
      mdx = std::max(mdx, (double)std::fabs(dx32[i])),
      ex = std::max(ex, (double)std::fabs(dx[i] - dx32[i]));
    for (size_t i = 0; i < dw.size(); ++i)
      mdw = std::max(mdw, (double)std::fabs(dw32[i])),
      ew = std::max(ew, (double)std::fabs(dw[i] - dw32[i]));
    REPORT(sw::dtype_name(t) << " lmhead vs fp32: loss " << dl << " dx " << ex / mdx << " dw "
                             << ew / mdw << " total " << tot << " vs " << tot32);
    CHECK(dl < 8 * ul * 5);  // logits are O(5) here
    CHECK(ex / mdx < 4 * ul);
    CHECK(ew / mdw < 4 * ul);
    // Rerun: bit-identical.
    Vec loss2(N), dx2((size_t)N * C), dw2((size_t)V * C);
    ops.lmhead_xent(loss2.data(), dx2.data(), dw2.data(), x.data(), w.data(), tg.data(), N, C, V,
                    gs);
    CHECK(same_bits(loss, loss2));
    CHECK(same_bits(dx, dx2));
    CHECK(same_bits(dw, dw2));
  }
}

namespace {

// Causal attention forward in double on rounded q, k, v, with P rounded (the kernel's operand
// of P V); returns out and, per element, sum_j p_j |v_j| / l (for the one-u_low allowance).
void attn_ref(DType t, const Vec& qkv, int B, int T, int H, int KVH, int hd, DVec& out,
              DVec& spv) {
  const Vec r = rounded(t, qkv);
  const int R = (H + 2 * KVH) * hd, CO = H * hd, rep = H / KVH;
  out.assign((size_t)B * T * CO, 0), spv.assign((size_t)B * T * CO, 0);
  const double scale = 1.0 / std::sqrt((double)hd);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const int g = h / rep;
        DVec s(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int c = 0; c < hd; ++c)
            d += (double)r[((size_t)b * T + i) * R + h * hd + c] *
                 r[((size_t)b * T + j) * R + (H + g) * hd + c];
          s[j] = d * scale, mx = std::max(mx, s[j]);
        }
        double l = 0;
        for (int j = 0; j <= i; ++j) l += std::exp(s[j] - mx);
        for (int j = 0; j <= i; ++j) {
          const double p = rnd(t, (float)std::exp(s[j] - mx));
          for (int c = 0; c < hd; ++c) {
            const double v = r[((size_t)b * T + j) * R + (H + KVH + g) * hd + c];
            out[((size_t)b * T + i) * CO + h * hd + c] += p * v / l;
            spv[((size_t)b * T + i) * CO + h * hd + c] += std::fabs(p * v) / l;
          }
        }
      }
}

}  // namespace

TEST_CASE("attention in bf16/fp16: forward vs rounded reference, both passes vs fp32") {
  // T = 70: not a multiple of the tiles; GQA (H 4, KVH 2) and MHA.
  for (auto [H, KVH] : {std::pair{4, 2}, {3, 3}}) {
    const int B = 2, T = 70, hd = 16, R = (H + 2 * KVH) * hd, CO = H * hd;
    const Vec qkv = randv((size_t)B * T * R, 41 + H), dout = randv((size_t)B * T * CO, 43);
    const sw::Ops& f32 = sw::ops_for(sw::Device::cpu());
    Vec o32((size_t)B * T * CO), l32((size_t)B * H * T), d32((size_t)B * T * R, 0.f);
    f32.attention_forward(o32.data(), l32.data(), qkv.data(), B, T, H, KVH, hd);
    f32.attention_backward(d32.data(), dout.data(), qkv.data(), o32.data(), l32.data(), B, T, H,
                           KVH, hd);
    for (DType t : {DType::BF16, DType::F16}) {
      const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), t);
      Vec o((size_t)B * T * CO), l((size_t)B * H * T), d((size_t)B * T * R, 0.f);
      ops.attention_forward(o.data(), l.data(), qkv.data(), B, T, H, KVH, hd);
      ops.attention_backward(d.data(), dout.data(), qkv.data(), o.data(), l.data(), B, T, H, KVH,
                             hd);
      DVec ref, spv;
      attn_ref(t, qkv, B, T, H, KVH, hd, ref, spv);
      // (a) out: P may round to the neighbouring value (u_low of each term) plus fp32 and
      // exp_approx error (~1e-6 on O(1) values, as in test_kernels_b).
      double wa = 0;
      for (size_t i = 0; i < o.size(); ++i)
        wa = std::max(wa, std::fabs(o[i] - ref[i]) / (u_low(t) * spv[i] + 1e-5));
      // (b) vs fp32, relative to the largest magnitude; measured bf16 ~5e-3 (out), ~1e-2
      // (gradients), fp16 ~8x less; tolerances 4 u_low and 8 u_low.
      double eo = 0, mo = 0, ed = 0, md = 0;
      for (size_t i = 0; i < o.size(); ++i)
        eo = std::max(eo, (double)std::fabs(o[i] - o32[i])),
        mo = std::max(mo, (double)std::fabs(o32[i]));
      for (size_t i = 0; i < d.size(); ++i)
        ed = std::max(ed, (double)std::fabs(d[i] - d32[i])),
        md = std::max(md, (double)std::fabs(d32[i]));
      REPORT(sw::dtype_name(t) << " attention H" << H << " KVH" << KVH << ": out err/bound " << wa
                               << ", vs fp32 out " << eo / mo << ", dqkv " << ed / md);
      CHECK(wa <= 1.0);
      CHECK(eo / mo < 4 * u_low(t));
      CHECK(ed / md < 8 * u_low(t));
      CHECK(eo > 0);  // rounding happened
      Vec o2((size_t)B * T * CO), l2((size_t)B * H * T), d2((size_t)B * T * R, 0.f);
      ops.attention_forward(o2.data(), l2.data(), qkv.data(), B, T, H, KVH, hd);
      ops.attention_backward(d2.data(), dout.data(), qkv.data(), o2.data(), l2.data(), B, T, H,
                             KVH, hd);
      CHECK(same_bits(o, o2));
      CHECK(same_bits(d, d2));
    }
  }
}

TEST_CASE("attention bf16 on vdpbf16ps: production shapes vs rounded reference and FMA path") {
  if (!sw::cpu::cpu_has_avx512_bf16()) return;  // the native path needs AVX512-BF16
  using sw::cpu::attention_backward;
  using sw::cpu::attention_forward;
  const DType t = DType::BF16;
  auto b16 = [](const Vec& v) {
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = sw::f32_to_bf16(v[i]);
    return r;
  };
  struct Shape {
    int B, T, H, KVH, hd;
  };
  // The step's shape family (hd 64, H 6): T 256 MHA; T 197 (no multiple of the tiles, odd:
  // a zero-padded last pair of query and key rows) with GQA; odd hd (pairs padded along hd);
  // hd 40 (20 pairs: one 16-word transpose block and a word-by-word rest).
  for (Shape s : {Shape{2, 256, 6, 6, 64}, Shape{1, 197, 6, 2, 64}, Shape{1, 45, 2, 1, 7},
                  Shape{2, 70, 3, 1, 40}}) {
    const int B = s.B, T = s.T, H = s.H, KVH = s.KVH, hd = s.hd;
    const int R = (H + 2 * KVH) * hd, CO = H * hd;
    const Vec qkv = randv((size_t)B * T * R, 51 + T), dout = randv((size_t)B * T * CO, 53);
    // Each path: forward and backward (set: dqkv's old contents, here NaN, not read).
    auto run = [&](bool native, Vec& o, Vec& l, Vec& d) {
      sw::cpu::set_attention_bf16_native(native);
      o.assign((size_t)B * T * CO, 0.f), l.assign((size_t)B * H * T, 0.f);
      d.assign((size_t)B * T * R, std::numeric_limits<float>::quiet_NaN());
      attention_forward(o.data(), l.data(), qkv.data(), B, T, H, KVH, hd, t);
      attention_backward(d.data(), dout.data(), qkv.data(), o.data(), l.data(), B, T, H, KVH, hd,
                         t, true);
      sw::cpu::set_attention_bf16_native(true);
    };
    Vec o, l, d, of, lf, df;
    run(true, o, l, d);
    run(false, of, lf, df);
    // (a) the forward against the double reference on rounded operands (P rounded), as above.
    DVec ref, spv;
    attn_ref(t, qkv, B, T, H, KVH, hd, ref, spv);
    double wa = 0, wf = 0;
    for (size_t i = 0; i < o.size(); ++i) {
      wa = std::max(wa, std::fabs(o[i] - ref[i]) / (u_low(t) * spv[i] + 1e-5));
      wf = std::max(wf, std::fabs(of[i] - ref[i]) / (u_low(t) * spv[i] + 1e-5));
    }
    // Native vs the FMA path: the same rounded operands, products summed in another order, so
    // the scores and lse agree to fp32 rounding and P, dS (formed in fp32, then rounded) may
    // land on the neighbouring bf16 value: out within the bound of (a) of each other; lse to
    // a few fp32 ulps of its magnitude; dqkv (sums of such terms, few of which flip) relative
    // to its largest magnitude within u_low / 8 (measured <= 6e-5, i.e. u_low / 70).
    double eo = 0, el = 0, ed = 0, md = 0;
    for (size_t i = 0; i < o.size(); ++i)
      eo = std::max(eo, std::fabs(o[i] - of[i]) / (2 * u_low(t) * spv[i] + 2e-5));
    for (size_t i = 0; i < l.size(); ++i)
      el = std::max(el, (double)std::fabs(l[i] - lf[i]) / (std::fabs(lf[i]) + 1));
    for (size_t i = 0; i < d.size(); ++i)
      ed = std::max(ed, (double)std::fabs(d[i] - df[i])), md = std::max(md, (double)std::fabs(df[i]));
    REPORT("native attention B" << B << " T" << T << " H" << H << " KVH" << KVH << " hd" << hd
                                << ": out err/bound " << wa << " (FMA path " << wf
                                << "), native vs FMA: out " << eo << ", lse " << el << ", dqkv "
                                << ed / md);
    CHECK(wa <= 1.0);
    CHECK(wf <= 1.0);
    CHECK(eo <= 1.0);
    CHECK(el < 64 * kU);
    CHECK(ed / md < u_low(t) / 8);
    // The Ops' 16-bit operands (qkv16, out16, dout16) read in place: the same values as the
    // fp32 ones rounded, so the same bits.
    const std::vector<uint16_t> q16 = b16(qkv), o16 = b16(o), d16 = b16(dout);
    Vec o2((size_t)B * T * CO), l2((size_t)B * H * T), d2((size_t)B * T * R, 0.f),
        d3((size_t)B * T * R, 0.f);
    attention_forward(o2.data(), l2.data(), nullptr, B, T, H, KVH, hd, t, q16.data());
    CHECK(same_bits(o, o2));
    CHECK(same_bits(l, l2));
    attention_backward(d2.data(), nullptr, nullptr, nullptr, l.data(), B, T, H, KVH, hd, t, true,
                       q16.data(), o16.data(), d16.data());
    const Vec ow = rounded(t, o), dw = rounded(t, dout);
    attention_backward(d3.data(), dw.data(), qkv.data(), ow.data(), l.data(), B, T, H, KVH, hd, t,
                       false);
    CHECK(same_bits(d2, d3));
    // Reruns and 1 vs 2 threads: bit-identical (tasks independent, fixed GQA order).
    const int nt = omp_get_max_threads();
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      Vec o1, l1, d1;
      run(true, o1, l1, d1);
      CHECK(same_bits(o, o1));
      CHECK(same_bits(l, l1));
      CHECK(same_bits(d, d1));
    }
    omp_set_num_threads(nt);
  }
}

TEST_CASE("attention bf16 on vdpbf16ps: edge shapes (T, hd tiny or odd) against the FMA path") {
  if (!sw::cpu::cpu_has_avx512_bf16()) return;
  const DType t = DType::BF16;
  double worst_a = 0, worst_d = 0;
  for (int T : {1, 2, 5, 16, 17, 65, 130})
    for (int hd : {1, 2, 3, 33})
      for (auto [H, KVH] : {std::pair{1, 1}, {4, 2}}) {
        const int B = 2, R = (H + 2 * KVH) * hd, CO = H * hd;
        const Vec qkv = randv((size_t)B * T * R, 7 * T + hd), dout = randv((size_t)B * T * CO, 9);
        Vec o[2], l[2], d[2];
        for (int native : {0, 1}) {
          sw::cpu::set_attention_bf16_native(native);
          o[native].assign((size_t)B * T * CO, 0.f), l[native].assign((size_t)B * H * T, 0.f);
          d[native].assign((size_t)B * T * R, 0.f);
          sw::cpu::attention_forward(o[native].data(), l[native].data(), qkv.data(), B, T, H, KVH,
                                     hd, t);
          sw::cpu::attention_backward(d[native].data(), dout.data(), qkv.data(), o[native].data(),
                                      l[native].data(), B, T, H, KVH, hd, t);
        }
        sw::cpu::set_attention_bf16_native(true);
        DVec ref, spv;
        attn_ref(t, qkv, B, T, H, KVH, hd, ref, spv);
        double wa = 0, ed = 0, md = 0;
        for (size_t i = 0; i < o[1].size(); ++i)
          wa = std::max(wa, std::fabs(o[1][i] - ref[i]) / (u_low(t) * spv[i] + 1e-5));
        for (size_t i = 0; i < d[1].size(); ++i)
          ed = std::max(ed, (double)std::fabs(d[1][i] - d[0][i])),
          md = std::max(md, (double)std::fabs(d[0][i]));
        worst_a = std::max(worst_a, wa), worst_d = std::max(worst_d, ed / md);
        INFO("T " << T << " hd " << hd << " H " << H << " KVH " << KVH);
        CHECK(wa <= 1.0);
        CHECK(ed <= md * u_low(t) / 8);
      }
  REPORT("native attention, edge shapes: out err/bound " << worst_a << ", dqkv vs FMA "
                                                         << worst_d);
}

TEST_CASE("round_to is f32_to_bf16 / f32_to_f16 bit for bit (NaN, inf, subnormals, ties)") {
  // Random bit patterns (every exponent, NaNs included) plus special values; lengths not a
  // multiple of the vector width.
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0xffffffffu, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                0x3f818000u, 0x7f7fffffu, 0x477fe000u, 0x477ff000u, 0x33800000u};
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 5000; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    bits.push_back((uint32_t)x);
  }
  Vec src(bits.size());
  std::memcpy(src.data(), bits.data(), bits.size() * 4);
  for (DType t : {DType::BF16, DType::F16}) {
    Vec dst(src.size());
    sw::cpu::round_to(t, dst.data(), src.data(), src.size());
    size_t bad = 0;
    for (size_t i = 0; i < src.size(); ++i) {
      const float e = rnd(t, src[i]);
      if (std::isnan(e) ? !std::isnan(dst[i]) : std::memcmp(&e, &dst[i], 4) != 0) ++bad;
    }
    INFO(sw::dtype_name(t) << ": " << bad << " of " << src.size() << " differ");
    CHECK(bad == 0);
    if (t == DType::BF16) {  // bf16 NaNs keep f32_to_bf16's exact bits
      Vec e = rounded(t, src);
      CHECK(same_bits(dst, e));
    }
    Vec inplace = src;
    sw::cpu::round_to(t, inplace.data(), inplace.data(), inplace.size());
    CHECK(same_bits(inplace, dst));
  }
}

TEST_CASE("narrow, widen, round_copy and the 16-bit GELU/SwiGLU outputs: core/dtype.h bit for bit") {
  // Issue 39 gave these loops a compile-time kind (they vectorise for bf16). Each element must
  // still be f32_to_bf16 / f32_to_f16 (widened: bf16_to_f32 / f16_to_f32) of the fp32 value,
  // NaN payloads included, on the parallel path (> 32K elements) and the serial one, at lengths
  // that are not a multiple of the vector width; GELU's and SwiGLU's 16-bit outputs are the
  // fp32 ops' outputs narrowed.
  auto to16 = [](DType t, float f) { return t == DType::BF16 ? sw::f32_to_bf16(f) : sw::f32_to_f16(f); };
  auto from16 = [](DType t, uint16_t h) {
    return t == DType::BF16 ? sw::bf16_to_f32(h) : sw::f16_to_f32(h);
  };
  for (size_t n : {size_t{1001}, size_t{70001}}) {
    std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                  0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x00000001u,
                                  0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x477ff000u};
    uint64_t x = 0x9e3779b97f4a7c15ull + n;
    while (bits.size() < n) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      bits.push_back(static_cast<uint32_t>(x));
    }
    Vec src(n);
    std::memcpy(src.data(), bits.data(), n * 4);
    for (DType t : {DType::BF16, DType::F16}) {
      INFO(sw::dtype_name(t) << " n " << n);
      std::vector<uint16_t> want16(n), got16(n), lp16(n);
      Vec want(n), got(n), lp(n), acc(n, 0.5f), acc_want(n);
      for (size_t i = 0; i < n; ++i) {
        want16[i] = to16(t, src[i]);
        want[i] = from16(t, want16[i]);
        acc_want[i] = 0.5f + from16(t, want16[i]);
      }
      sw::cpu::narrow(t, src.data(), got16.data(), n);
      CHECK(got16 == want16);
      sw::cpu::widen(t, want16.data(), got.data(), n);
      CHECK(same_bits(got, want));
      sw::cpu::add_widened(t, want16.data(), acc.data(), n);
      CHECK(same_bits(acc, acc_want));
      sw::cpu::round_copy(t, got.data(), src.data(), n);
      CHECK(same_bits(got, want));
      sw::cpu::round_copy_lp(t, lp.data(), lp16.data(), src.data(), n);
      CHECK(same_bits(lp, want));
      CHECK(lp16 == want16);
      Vec inplace = src;  // narrowed in place, then widened back in place
      sw::cpu::narrow(t, inplace.data(), inplace.data(), n);
      CHECK(std::memcmp(inplace.data(), want16.data(), n * 2) == 0);
      sw::cpu::widen(t, inplace.data(), inplace.data(), n);
      CHECK(same_bits(inplace, want));
    }
  }
  // GELU and SwiGLU with 16-bit outputs (from fp32 and from 16-bit inputs).
  const int N = 67, F = 1031;  // N * F > 32K: the parallel path
  const size_t n = size_t(N) * F;
  Vec a = randv(2 * n, 11, 3.f);
  for (DType t : {DType::BF16, DType::F16}) {
    INFO(sw::dtype_name(t));
    std::vector<uint16_t> a16(2 * n), got(2 * n), want(2 * n);
    sw::cpu::narrow(t, a.data(), a16.data(), 2 * n);
    Vec a_r(2 * n), f(2 * n);
    sw::cpu::widen(t, a16.data(), a_r.data(), 2 * n);
    sw::cpu::gelu_forward(f.data(), a.data(), n);
    for (size_t i = 0; i < n; ++i) want[i] = to16(t, f[i]);
    sw::cpu::gelu_forward_lp(t, got.data(), a.data(), n);
    CHECK(std::equal(want.begin(), want.begin() + n, got.begin()));
    sw::cpu::gelu_forward(f.data(), a_r.data(), n);
    for (size_t i = 0; i < n; ++i) want[i] = to16(t, f[i]);
    sw::cpu::gelu_forward_lp(t, got.data(), a16.data(), n);
    CHECK(std::equal(want.begin(), want.begin() + n, got.begin()));
    sw::cpu::swiglu_forward(f.data(), a_r.data(), N, F);
    for (size_t i = 0; i < n; ++i) want[i] = to16(t, f[i]);
    sw::cpu::swiglu_forward_lp(t, got.data(), a16.data(), N, F);
    CHECK(std::equal(want.begin(), want.begin() + n, got.begin()));
    Vec dout = randv(n, 12), dgu(2 * n);
    sw::cpu::swiglu_backward(dgu.data(), dout.data(), a_r.data(), N, F, true);
    for (size_t i = 0; i < 2 * n; ++i) want[i] = to16(t, dgu[i]);
    sw::cpu::swiglu_backward_lp_set(t, got.data(), dout.data(), nullptr, nullptr, a16.data(), N, F);
    CHECK(got == want);
  }
}

// Ops::adamw with a 16-bit copy alone writes it in AdamW's pass (cpu_ops.cpp): the same bits
// as adamw and then narrow, and the same fp32 state; the other copy forms unchanged.
TEST_CASE("AdamW writing the 16-bit weight copy in its pass = adamw then narrow") {
  const size_t n = 70001;  // > 32K: the parallel path, and a ragged tail
  const Vec p0 = randv(n, 81), g = randv(n, 82, 0.1f), m0 = randv(n, 83, 0.01f);
  Vec v0 = randv(n, 84, 0.01f);
  for (float& x : v0) x = x * x;
  for (DType t : {DType::BF16, DType::F16}) {
    INFO(sw::dtype_name(t));
    const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), t);
    Vec p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
    std::vector<uint16_t> c1(n), c2(n);
    for (int step = 1; step <= 3; ++step) {
      sw::cpu::adamw(p1.data(), g.data(), m1.data(), v1.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                     0.1f, step, 0.5f);
      sw::cpu::narrow(t, p1.data(), c1.data(), n);
      sw::AdamWCopies c;
      c.dt = t, c.param16 = c2.data();
      ops.adamw(p2.data(), g.data(), m2.data(), v2.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                step, 0.5f, c);
      CHECK(same_bits(p1, p2));
      CHECK(same_bits(m1, m2));
      CHECK(same_bits(v1, v2));
      CHECK(c1 == c2);
    }
  }
}

// A one-rank unit's gradients rounded to bf16 by their readers on the CPU (Ops::
// rounds_grads_on_read): AdamW's pass (grad_dt BF16) and the norm's sums read them rounded, the
// same bits as rounding them in place first (round_to) and reading that. Gradients spanning
// magnitudes, with exact ties (round to even up and down), NaN and inf.
TEST_CASE("bf16 gradients rounded as AdamW and the norm read them = rounded in place first") {
  const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), DType::BF16);
  for (DType c : {DType::F32, DType::BF16, DType::F16}) {  // (whatever the Ops' compute)
    CHECK(sw::ops_for(sw::Device::cpu(), c).rounds_grads_on_read(DType::BF16));
    CHECK(!sw::ops_for(sw::Device::cpu(), c).rounds_grads_on_read(DType::F16));
  }
  const size_t n = 70001 + (size_t{1} << 17);  // several sums chunks, parallel, a ragged tail
  const Vec p0 = randv(n, 91), m0 = randv(n, 93, 0.01f);
  Vec g = randv(n, 92), v0 = randv(n, 94, 0.01f);
  for (float& x : v0) x = x * x;
  for (size_t i = 0; i < n; ++i) g[i] *= std::ldexp(1.f, int(i % 41) - 20);
  for (size_t i = 0; i < n; i += 97)  // ties: the low half exactly 0x8000, both parities
    g[i] = std::bit_cast<float>((std::bit_cast<uint32_t>(g[i]) & 0xffff0000u) | 0x8000u);
  Vec gr = g;
  sw::cpu::round_to(DType::BF16, gr.data(), gr.data(), n);
  size_t changed = 0;
  for (size_t i = 0; i < n; ++i)
    changed += std::bit_cast<uint32_t>(g[i]) != std::bit_cast<uint32_t>(gr[i]);
  REQUIRE(changed > n / 2);  // (the rounding matters: most values move)
  Vec p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
  std::vector<uint16_t> c1(n), c2(n);
  for (int step = 1; step <= 2; ++step) {
    sw::cpu::adamw16(p1.data(), gr.data(), m1.data(), v1.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                     0.1f, step, 0.5f, DType::BF16, c1.data());
    ops.adamw_copies(p2.data(), g.data(), m2.data(), v2.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                     0.1f, step, 0.5f, DType::BF16, nullptr, c2.data(), DType::BF16);
    CHECK(same_bits(p1, p2));
    CHECK(same_bits(m1, m2));
    CHECK(same_bits(v1, v2));
    CHECK(c1 == c2);
  }
  // The sums: one buffer, several at once, and a NaN and an inf (NaN either way).
  const float* xs[2] = {g.data(), g.data() + 5};
  const size_t ns[2] = {n, 1000};
  double got[2], want[2];
  ops.sum_squares_rounded_into(DType::BF16, xs, ns, 2, got);
  want[0] = sw::cpu::sum_squares(gr.data(), n), want[1] = sw::cpu::sum_squares(gr.data() + 5, 1000);
  CHECK(std::bit_cast<uint64_t>(got[0]) == std::bit_cast<uint64_t>(want[0]));
  CHECK(std::bit_cast<uint64_t>(got[1]) == std::bit_cast<uint64_t>(want[1]));
  Vec bad(std::begin(g), std::begin(g) + 300);
  bad[7] = std::numeric_limits<float>::infinity();
  bad[200] = std::numeric_limits<float>::quiet_NaN();
  const float* xb = bad.data();
  const size_t nb = bad.size();
  ops.sum_squares_rounded_into(DType::BF16, &xb, &nb, 1, got);
  CHECK(std::isnan(got[0]));
}

// The 16-bit-input GELU runs by table (elementwise.cpp): every one of the 65536 inputs, NaN and
// inf included, against the formula loops on the widened values, bit for bit.
TEST_CASE("GELU on 16-bit inputs (by table) = the fp32 formula on the widened values for every input") {
  constexpr size_t n = size_t{1} << 16;
  auto to16 = [](DType t, float f) { return t == DType::BF16 ? sw::f32_to_bf16(f) : sw::f32_to_f16(f); };
  auto to32 = [](DType t, uint16_t h) { return t == DType::BF16 ? sw::bf16_to_f32(h) : sw::f16_to_f32(h); };
  for (DType t : {DType::BF16, DType::F16}) {
    INFO(sw::dtype_name(t));
    std::vector<uint16_t> x16(2 * n), d16(2 * n), got(2 * n), want(2 * n);
    for (size_t i = 0; i < 2 * n; ++i) x16[i] = static_cast<uint16_t>(i * 40503u);  // each twice
    const Vec d = randv(2 * n, 71, 4.f);
    sw::cpu::narrow(t, d.data(), d16.data(), 2 * n);
    Vec x(2 * n), dw(2 * n), f(2 * n), g(2 * n), g_tab(2 * n);
    sw::cpu::widen(t, x16.data(), x.data(), 2 * n);
    sw::cpu::widen(t, d16.data(), dw.data(), 2 * n);
    auto bits_equal = [](uint16_t a, uint16_t b, float fa) { return a == b || std::isnan(fa); };
    // Forward: the 16-bit output.
    sw::cpu::gelu_forward(f.data(), x.data(), 2 * n);
    for (size_t i = 0; i < 2 * n; ++i) want[i] = to16(t, f[i]);
    sw::cpu::gelu_forward_lp(t, got.data(), x16.data(), 2 * n);
    size_t bad = 0;
    for (size_t i = 0; i < 2 * n; ++i) bad += !bits_equal(got[i], want[i], f[i]);
    CHECK(bad == 0);
    bad = 0;
    for (size_t i = 0; i < 2 * n; ++i)  // NaN in, NaN out
      if (std::isnan(f[i])) bad += !std::isnan(to32(t, got[i]));
    CHECK(bad == 0);
    // Backward, written: fp32 and 16-bit dinp, dout fp32 and 16-bit.
    sw::cpu::gelu_backward_set(t, g.data(), x.data(), nullptr, dw.data(), nullptr, 2 * n);
    for (const bool d_is16 : {false, true}) {
      INFO("dout 16-bit " << d_is16);
      sw::cpu::gelu_backward_set(t, g_tab.data(), nullptr, x16.data(), d_is16 ? nullptr : dw.data(),
                                 d_is16 ? d16.data() : nullptr, 2 * n);
      bad = 0;
      for (size_t i = 0; i < 2 * n; ++i)
        bad += !(std::memcmp(&g[i], &g_tab[i], 4) == 0 || (std::isnan(g[i]) && std::isnan(g_tab[i])));
      CHECK(bad == 0);
      for (size_t i = 0; i < 2 * n; ++i) want[i] = to16(t, g[i]);
      sw::cpu::gelu_backward_lp_set(t, got.data(), nullptr, x16.data(), d_is16 ? nullptr : dw.data(),
                                    d_is16 ? d16.data() : nullptr, 2 * n);
      bad = 0;
      for (size_t i = 0; i < 2 * n; ++i) bad += !bits_equal(got[i], want[i], g[i]);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("linear in bf16/fp16: operands fp32, 16-bit or both give the same bits") {
  // Issue 39: the oneDNN path reads a 16-bit operand in place and the others widen it; every
  // combination of forms (the fp32 form exactly the 16-bit one widened, as sharding/unit_state.h
  // keeps a unit's weights) must give the bits of the all-fp32 call, on every path.
  using sw::Operand;
  for (DType t : {DType::BF16, DType::F16}) {
    const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), t);
    const int N = 33, C = 70, OC = 41;
    auto both = [&](const Vec& v, std::vector<uint16_t>& h) {
      h.resize(v.size());
      sw::cpu::narrow(t, v.data(), h.data(), v.size());
      Vec r(v.size());
      sw::cpu::widen(t, h.data(), r.data(), v.size());
      return r;
    };
    std::vector<uint16_t> x16, w16, d16;
    const Vec x = both(randv((size_t)N * C, 21), x16), w = both(randv((size_t)OC * C, 22), w16);
    const Vec dout = both(randv((size_t)N * OC, 23), d16), b = randv(OC, 24);
    auto forms = [](const Vec& f, const std::vector<uint16_t>& h, int k) {
      return k == 0 ? Operand(f.data()) : k == 1 ? Operand(h.data()) : Operand(f.data(), h.data());
    };
    Vec out_ref, dx_ref, dw_ref, db_ref;
    for (int kx = 0; kx < 3; ++kx)
      for (int kw = 0; kw < 3; ++kw)
        for (int kd = 0; kd < 3; ++kd) {
          INFO(sw::dtype_name(t) << " forms x " << kx << " w " << kw << " dout " << kd);
          Vec out((size_t)N * OC), dx((size_t)N * C, 0.25f), dw((size_t)OC * C, -0.5f),
              db(OC, 0.125f);
          ops.linear_forward(out.data(), forms(x, x16, kx), forms(w, w16, kw), b.data(), nullptr,
                             N, C, OC);
          ops.linear_backward(dx.data(), dw.data(), db.data(), forms(dout, d16, kd),
                              forms(x, x16, kx), forms(w, w16, kw), N, C, OC);
          if (kx + kw + kd == 0) {
            out_ref = out, dx_ref = dx, dw_ref = dw, db_ref = db;
            continue;
          }
          CHECK(same_bits(out, out_ref));
          CHECK(same_bits(dx, dx_ref));
          CHECK(same_bits(dw, dw_ref));
          CHECK(same_bits(db, db_ref));
        }
  }
}

TEST_CASE("LM head in bf16: the weight's bf16 form given or not, the same bits") {
  // Issue 39: on the oneDNN path lmhead_xent hands w, x and dlogits over in bf16 (w16 where the
  // caller has it, else w narrowed once). Three chunks of rows (N > 2 x 512), ignored targets.
  const int N = 1100, C = 96, V = 777;
  std::vector<uint16_t> w16((size_t)V * C);
  const Vec x = randv((size_t)N * C, 31);
  Vec w = randv((size_t)V * C, 32);
  sw::cpu::round_copy_lp(DType::BF16, w.data(), w16.data(), w.data(), w.size());
  std::vector<int32_t> tg(N);
  for (int i = 0; i < N; ++i) tg[i] = (i * 37) % V - (i % 50 == 0 ? V : 0);
  Vec loss[2], dx[2], dw[2];
  double total[2];
  for (int k = 0; k < 2; ++k) {
    loss[k].assign(N, 0.f), dx[k].assign((size_t)N * C, 0.1f), dw[k].assign((size_t)V * C, 0.2f);
    total[k] = sw::cpu::lmhead_xent(loss[k].data(), dx[k].data(), dw[k].data(), x.data(),
                                    w.data(), tg.data(), N, C, V, 0.5f, DType::BF16,
                                    k ? w16.data() : nullptr);
  }
  CHECK(total[0] == total[1]);
  CHECK(same_bits(loss[0], loss[1]));
  CHECK(same_bits(dx[0], dx[1]));
  CHECK(same_bits(dw[0], dw[1]));
}

TEST_CASE("16-bit outputs the product writes itself are narrow() of the fp32 ones") {
  // Issue 39: on the oneDNN path a linear's 16-bit output and its 16-bit input gradient come
  // from oneDNN's bf16 output (bias added in the product), the GELU's 16-bit gradient is
  // narrowed as it is written, and the LM head reads a 16-bit-only weight in place. Each must
  // give the bits of the fp32 result narrowed (no fp32-subnormal values arise here), on every
  // path (fp16 and non-oneDNN CPUs take the fp32-then-narrow route).
  using sw::GradIn;
  using sw::Operand;
  for (DType t : {DType::BF16, DType::F16}) {
    INFO(sw::dtype_name(t));
    const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), t);
    const int N = 37, C = 70, OC = 45;
    const Vec x = randv((size_t)N * C, 51), w = randv((size_t)OC * C, 52);
    const Vec dout = randv((size_t)N * OC, 53), b = randv(OC, 54);
    auto narrowed = [&](const Vec& v) {
      std::vector<uint16_t> h(v.size());
      sw::cpu::narrow(t, v.data(), h.data(), v.size());
      return h;
    };
    for (const float* bias : {b.data(), (const float*)nullptr}) {
      Vec out((size_t)N * OC);
      std::vector<uint16_t> out16((size_t)N * OC);
      ops.linear_forward(out.data(), x.data(), w.data(), bias, nullptr, N, C, OC);
      ops.linear_forward(out16.data(), x.data(), w.data(), bias, nullptr, N, C, OC);
      CHECK(out16 == narrowed(out));
    }
    // dinp 16-bit alone (written) beside dW and db, against the fp32 dinp narrowed.
    Vec dx((size_t)N * C), dw((size_t)OC * C, 0.5f), db(OC, 0.25f);
    Vec dw2 = dw, db2 = db;
    std::vector<uint16_t> dx16((size_t)N * C);
    ops.linear_backward(GradIn::set(dx.data()), dw.data(), db.data(), dout.data(), x.data(),
                        w.data(), N, C, OC);
    ops.linear_backward(GradIn::set(nullptr, dx16.data()), dw2.data(), db2.data(), dout.data(),
                        x.data(), w.data(), N, C, OC);
    CHECK(dx16 == narrowed(dx));
    CHECK(same_bits(dw, dw2));
    CHECK(same_bits(db, db2));
    // GELU's gradient written 16-bit alone.
    const size_t n = 1000;
    const Vec gx = randv(n, 55), gd = randv(n, 56);
    Vec g(n);
    std::vector<uint16_t> g16(n);
    ops.gelu_backward(GradIn::set(g.data()), gx.data(), gd.data(), n);
    ops.gelu_backward(GradIn::set(nullptr, g16.data()), gx.data(), gd.data(), n);
    CHECK(g16 == narrowed(g));
    // The norms' backward: dinp added into, its 16-bit form written in the same pass.
    const Vec nx = randv((size_t)N * C, 59), ng = randv((size_t)N * C, 60), nw = randv(C, 61);
    Vec mean(N), rstd(N), ln((size_t)N * C);
    ops.layernorm_forward(ln.data(), mean.data(), rstd.data(), nx.data(), nw.data(), nw.data(), N,
                          C);
    for (int rms = 0; rms < 2; ++rms) {
      Vec d((size_t)N * C, 0.25f), dwn(C, 0.f), dbn(C, 0.f);
      std::vector<uint16_t> d16((size_t)N * C);
      if (rms)
        ops.rmsnorm_backward(GradIn::add(d.data(), d16.data()), dwn.data(), ng.data(), nx.data(),
                             nw.data(), rstd.data(), N, C);
      else
        ops.layernorm_backward(GradIn::add(d.data(), d16.data()), dwn.data(), dbn.data(),
                               ng.data(), nx.data(), nw.data(), mean.data(), rstd.data(), N, C);
      CHECK(d16 == narrowed(d));
    }
  }
  // Attention's 16-bit output and dqkv (the native bf16 path writes them itself; grouped heads'
  // dqkv and the other paths narrow an fp32 result): narrow() of the kernel's fp32 values on the
  // same 16-bit operands. MHA and GQA.
  for (auto [H, KVH] : {std::pair{4, 4}, {4, 2}}) {
    INFO("attention H " << H << " KVH " << KVH);
    const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), DType::BF16);
    const int B = 2, T = 75, hd = 32, R = (H + 2 * KVH) * hd, CO = H * hd;
    std::vector<uint16_t> q16((size_t)B * T * R), d16((size_t)B * T * CO);
    const Vec q = randv(q16.size(), 62), dq = randv(d16.size(), 63);
    sw::cpu::narrow(DType::BF16, q.data(), q16.data(), q.size());
    sw::cpu::narrow(DType::BF16, dq.data(), d16.data(), dq.size());
    Vec o32((size_t)B * T * CO), lse((size_t)B * H * T), lse2 = lse;
    sw::cpu::attention_forward(o32.data(), lse.data(), nullptr, B, T, H, KVH, hd, DType::BF16,
                               q16.data());
    std::vector<uint16_t> o16((size_t)B * T * CO);
    ops.attention_forward(o16.data(), lse2.data(), q16.data(), B, T, H, KVH, hd);
    std::vector<uint16_t> o16ref(o16.size());
    sw::cpu::narrow(DType::BF16, o32.data(), o16ref.data(), o32.size());
    CHECK(o16 == o16ref);
    CHECK(same_bits(lse, lse2));
    Vec dqkv32((size_t)B * T * R);
    sw::cpu::attention_backward(dqkv32.data(), nullptr, nullptr, nullptr, lse.data(), B, T, H,
                                KVH, hd, DType::BF16, true, q16.data(), o16.data(), d16.data());
    std::vector<uint16_t> g16((size_t)B * T * R), g16ref(g16.size());
    ops.attention_backward(GradIn::set(nullptr, g16.data()), d16.data(), q16.data(), o16.data(),
                           lse.data(), B, T, H, KVH, hd);
    sw::cpu::narrow(DType::BF16, dqkv32.data(), g16ref.data(), dqkv32.size());
    CHECK(g16 == g16ref);
  }
  // The LM head through the Ops with its weight 16-bit only (a unit's products_only table):
  // the bits of the call given both forms.
  const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), DType::BF16);
  const int N = 600, C = 64, V = 333;
  const Vec x = randv((size_t)N * C, 57);
  Vec w = randv((size_t)V * C, 58);
  std::vector<uint16_t> w16((size_t)V * C);
  sw::cpu::round_copy_lp(DType::BF16, w.data(), w16.data(), w.data(), w.size());
  std::vector<int32_t> tg(N);
  for (int i = 0; i < N; ++i) tg[i] = (i * 13) % V;
  Vec loss[2], dx[2], dw[2];
  double total[2];
  for (int k = 0; k < 2; ++k) {
    loss[k].assign(N, 0.f), dx[k].assign((size_t)N * C, 0.f), dw[k].assign((size_t)V * C, 0.f);
    total[k] = ops.lmhead_xent(loss[k].data(), dx[k].data(), dw[k].data(), x.data(),
                               k ? Operand(w16.data()) : Operand(w.data(), w16.data()),
                               tg.data(), N, C, V, 1.f / N);
  }
  CHECK(total[0] == total[1]);
  CHECK(same_bits(loss[0], loss[1]));
  CHECK(same_bits(dx[0], dx[1]));
  CHECK(same_bits(dw[0], dw[1]));
}
