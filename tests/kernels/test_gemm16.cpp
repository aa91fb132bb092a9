// The bf16 products on 16-bit operands (cpu_internal.h gemm_bf16_16): Shardwise's own
// AVX512-BF16 kernels (gemm_bf16_tn.cpp) and the dispatcher that chooses them or oneDNN.
//
// (a) Against a double-precision reference on the same bf16 values: a product of two bf16
//     values is exact in fp32, so only fp32 accumulation errs, within the proven bound
//     (K + 2) u (|alpha| sum_k |a_k b_k| + |bias| + |beta c|), u = 2^-24. Edge shapes: tiles
//     cut short in rows and columns, odd K (the transposed-A kernel pads the last pair), row
//     strides wider than the rows, K over one block (the partial sums carried in C), more
//     panels than one L2 group, alpha, beta, a bias row.
// (b) A bf16 output is the fp32 output of the same call rounded by f32_to_bf16, bit for bit
//     (subnormals kept, unlike oneDNN's vcvtneps2bf16).
// (c) One thread and two give the same bits (each C element is one thread's, same order).
// (d) Where a kernel does not apply (odd K or row stride for A read in place) it says so and
//     writes nothing; the dispatcher's answer for those is oneDNN's, within the same bound.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

using sw::bf16_to_f32;
using sw::f32_to_bf16;

namespace {

struct Case {
  bool ta, tb;
  int M, N, K, pad;  // pad: extra elements per row of A and B (row strides wider than rows)
  float alpha, beta;
  bool bias;
};

struct Operands {
  int lda, ldb;
  std::vector<uint16_t> A, B;
  std::vector<float> bias, C0;
};

Operands make(const Case& c, uint32_t seed) {
  Operands o;
  const int ar = c.ta ? c.K : c.M, ac = c.ta ? c.M : c.K;
  const int br = c.tb ? c.N : c.K, bc = c.tb ? c.K : c.N;
  o.lda = ac + c.pad;
  o.ldb = bc + c.pad;
  uint32_t x = seed;
  auto rnd = [&] {
    x = x * 1664525u + 1013904223u;
    return (float)((x >> 8) & 0xffff) / 32768.f - 1.f;
  };
  o.A.resize((size_t)ar * o.lda);
  o.B.resize((size_t)br * o.ldb);
  for (auto& v : o.A) v = f32_to_bf16(rnd());
  for (auto& v : o.B) v = f32_to_bf16(rnd());
  o.bias.resize(c.N);
  for (auto& v : o.bias) v = rnd();
  o.C0.resize((size_t)c.M * c.N);
  for (auto& v : o.C0) v = rnd();
  return o;
}

float a_at(const Case& c, const Operands& o, int i, int k) {
  return bf16_to_f32(c.ta ? o.A[(size_t)k * o.lda + i] : o.A[(size_t)i * o.lda + k]);
}
float b_at(const Case& c, const Operands& o, int k, int j) {
  return bf16_to_f32(c.tb ? o.B[(size_t)j * o.ldb + k] : o.B[(size_t)k * o.ldb + j]);
}

// Checks C against the double reference within the accumulation bound; returns the worst
// error over its bound (<= 1 passes).
double worst_vs_reference(const Case& c, const Operands& o, const std::vector<float>& C) {
  const double u = std::ldexp(1.0, -24);
  double worst = 0;
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < c.N; ++j) {
      double s = 0, sa = 0;
      for (int k = 0; k < c.K; ++k) {
        const double p = (double)a_at(c, o, i, k) * b_at(c, o, k, j);
        s += p;
        sa += std::fabs(p);
      }
      const double c0 = o.C0[(size_t)i * c.N + j], bi = c.bias ? o.bias[j] : 0.0;
      const double ref = c.alpha * s + bi + c.beta * c0;
      const double bound =
          (c.K + 2) * u * (std::fabs(c.alpha) * sa + std::fabs(bi) + std::fabs(c.beta * c0)) +
          1e-30;
      worst = std::max(worst, std::fabs(C[(size_t)i * c.N + j] - ref) / bound);
    }
  return worst;
}

// The own kernel for the case (returns false where it does not apply).
bool own(const Case& c, const Operands& o, std::vector<float>& C, uint16_t* C16 = nullptr) {
  if (c.ta) {
    sw::cpu::detail::gemm_bf16_tn16_avx512(c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(),
                                           o.ldb, c.beta, C.data(), c.N);
    return true;
  }
  return sw::cpu::detail::gemm_bf16_n16_avx512(c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda,
                                               o.B.data(), o.ldb, c.beta,
                                               C16 ? nullptr : C.data(), c.N,
                                               c.bias ? o.bias.data() : nullptr, C16);
}

std::string name(const Case& c) {
  return std::string(c.ta ? "A^T" : "A") + (c.tb ? " B^T" : " B") + " M" + std::to_string(c.M) +
         " N" + std::to_string(c.N) + " K" + std::to_string(c.K) + " pad" +
         std::to_string(c.pad) + " alpha" + std::to_string(c.alpha) + " beta" +
         std::to_string(c.beta) + (c.bias ? " bias" : "");
}

const std::vector<Case> kCases = {
    // A^T B (weight gradients): tiles cut short, odd K, wide rows, two K blocks (K > 1024)
    {true, false, 37, 53, 29, 0, 1.f, 0.f, false},
    {true, false, 8, 48, 64, 0, 1.f, 0.f, false},
    {true, false, 70, 100, 2101, 3, 0.5f, 1.f, false},
    {true, false, 130, 20, 1030, 0, -1.f, 0.25f, false},
    {true, false, 150, 300, 1100, 0, 1.f, 0.f, false},  // panels in more than one group
    // A B and A B^T: tiles cut short, a bias, alpha / beta, wide rows, K over one block (2048)
    {false, false, 37, 53, 30, 0, 1.f, 0.f, false},
    {false, false, 45, 97, 4200, 2, 0.5f, 1.f, false},
    {false, true, 37, 53, 30, 0, 1.f, 0.f, true},
    {false, true, 61, 150, 2050, 4, 1.f, 0.5f, true},
    {false, true, 9, 200, 64, 0, 2.f, 0.f, false},
    {false, false, 300, 17, 128, 0, 1.f, 1.f, true},
};

}  // namespace

TEST_CASE("own bf16 kernels on 16-bit operands = double reference within the fp32 bound") {
  if (!sw::cpu::cpu_has_avx512_bf16()) return;  // the kernels need AVX512-BF16
  uint32_t seed = 7;
  for (const Case& c : kCases) {
    INFO(name(c));
    const Operands o = make(c, seed++);
    std::vector<float> C = o.C0;
    REQUIRE(own(c, o, C));
    CHECK(worst_vs_reference(c, o, C) <= 1.0);
  }
}

TEST_CASE("own bf16 kernels: a bf16 output is f32_to_bf16 of the fp32 one, bit for bit") {
  if (!sw::cpu::cpu_has_avx512_bf16()) return;
  uint32_t seed = 100;
  for (Case c : kCases) {
    if (c.ta || c.K > 2048) continue;  // bf16 output: A read in place, one K block
    c.beta = 0.f;
    // A tiny alpha (and no bias), so that the results are subnormals (kept, not flushed;
    // vdpbf16ps itself flushes subnormal operands and sums, so they come from the scaling).
    c.alpha = 3e-39f;
    c.bias = false;
    INFO(name(c));
    const Operands o = make(c, seed++);
    std::vector<float> C(o.C0.size());
    std::vector<uint16_t> C16(o.C0.size(), 0xdead);
    REQUIRE(own(c, o, C));
    REQUIRE(own(c, o, C, C16.data()));
    size_t mismatches = 0, subnormal = 0;
    for (size_t i = 0; i < C.size(); ++i) {
      mismatches += C16[i] != f32_to_bf16(C[i]);
      subnormal += C[i] != 0.f && std::fabs(C[i]) < 1.17549435e-38f;
    }
    CHECK(mismatches == 0);
    CHECK(subnormal > C.size() / 2);  // (the case really has subnormal results)
  }
}

TEST_CASE("own bf16 kernels: one thread and two give the same bits") {
  if (!sw::cpu::cpu_has_avx512_bf16()) return;
  uint32_t seed = 200;
  const int saved = omp_get_max_threads();
  for (Case c : kCases) {
    // 8x the rows: the kernels split a product of >= 4e6 flops between the threads, which six
    // of the cases then are (both A^T B with K > 1024, both A B / A B^T with K > 2048, and the
    // 2400-row bias case); the smaller ones run on one thread either way.
    c.M *= 8;
    INFO(name(c));
    const Operands o = make(c, seed++);
    std::vector<float> C1 = o.C0, C2 = o.C0;
    omp_set_num_threads(1);
    REQUIRE(own(c, o, C1));
    omp_set_num_threads(2);
    REQUIRE(own(c, o, C2));
    CHECK(std::memcmp(C1.data(), C2.data(), C1.size() * sizeof(float)) == 0);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("own bf16 kernels decline what they do not cover, and the dispatcher then runs oneDNN") {
  if (!sw::cpu::cpu_has_avx512()) return;  // oneDNN's path here needs AVX-512
  // Odd K and an odd row stride of A: A's pairs are not 32-bit words in place.
  const std::vector<Case> odd = {{false, false, 1100, 40, 31, 0, 1.f, 0.f, false},
                                 {false, true, 1100, 40, 30, 1, 1.f, 0.f, true}};
  uint32_t seed = 300;
  for (const Case& c : odd) {
    INFO(name(c));
    const Operands o = make(c, seed++);
    if (sw::cpu::cpu_has_avx512_bf16()) {
      std::vector<float> C = o.C0;
      CHECK_FALSE(own(c, o, C));
      CHECK(C == o.C0);  // nothing written
    }
    std::vector<float> C = o.C0;
    sw::cpu::detail::gemm_bf16_16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, nullptr, o.A.data(), o.lda,
                                  nullptr, o.B.data(), o.ldb, c.beta, C.data(), c.N,
                                  c.bias ? o.bias.data() : nullptr, nullptr);
    CHECK(worst_vs_reference(c, o, C) <= 1.0);
  }
  // And every case of the kernels through the dispatcher (own kernel or oneDNN by shape).
  for (const Case& c : kCases) {
    INFO(name(c));
    const Operands o = make(c, seed++);
    std::vector<float> C = o.C0;
    sw::cpu::detail::gemm_bf16_16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, nullptr, o.A.data(), o.lda,
                                  nullptr, o.B.data(), o.ldb, c.beta, C.data(), c.N,
                                  c.bias ? o.bias.data() : nullptr, nullptr);
    CHECK(worst_vs_reference(c, o, C) <= 1.0);
  }
}

// A ReusePackedB scope: the own A op(B) kernel packs each B once and reuses the packed form for
// later products by the same B (the LM head's chunks): the same bits as packing every time,
// with two Bs alternating (forward w^T and dx w, two slots), and nothing stale once the scope
// has ended (B changed after it: the next product sees the change).
TEST_CASE("own bf16 kernels: a packed B reused inside a ReusePackedB scope gives the same bits") {
  if (!sw::cpu::cpu_has_avx512_bf16()) return;
  const Case fwd{false, true, 1024, 200, 96, 2, 1.f, 0.f, true};
  const Case dx{false, false, 1024, 96, 200, 0, 1.f, 1.f, false};
  Operands of = make(fwd, 400), od = make(dx, 401);
  std::vector<float> want_f(of.C0.size()), want_d = od.C0;
  REQUIRE(own(fwd, of, want_f));
  REQUIRE(own(dx, od, want_d));
  {
    const sw::cpu::detail::ReusePackedB scope;
    CHECK(sw::cpu::detail::reuse_packed_b(fwd.N, fwd.K));
    CHECK_FALSE(sw::cpu::detail::reuse_packed_b(50257, 768));  // (77 MB packed: not kept)
    for (int rep = 0; rep < 3; ++rep) {  // rep 0 packs, 1 and 2 reuse
      std::vector<float> Cf(of.C0.size()), Cd = od.C0;
      REQUIRE(own(fwd, of, Cf));
      REQUIRE(own(dx, od, Cd));
      CHECK(std::memcmp(Cf.data(), want_f.data(), Cf.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(Cd.data(), want_d.data(), Cd.size() * sizeof(float)) == 0);
    }
  }
  CHECK_FALSE(sw::cpu::detail::reuse_packed_b(fwd.N, fwd.K));
  // B changed after the scope (same pointer): a new scope packs it again.
  for (auto& v : of.B) v = f32_to_bf16(-bf16_to_f32(v));
  std::vector<float> neg(of.C0.size()), got(of.C0.size());
  {
    const sw::cpu::detail::ReusePackedB scope;
    REQUIRE(own(fwd, of, got));
  }
  REQUIRE(own(fwd, of, neg));  // (outside a scope: packed afresh)
  CHECK(std::memcmp(got.data(), neg.data(), got.size() * sizeof(float)) == 0);
  CHECK(worst_vs_reference(fwd, of, got) <= 1.0);
}

// (e) The weight-gradient kernel's bias gradient (gemm_bf16_16_dw_db): dout's column sums taken
// as it packs dout are column_sums' bits (fp32, rows in order), written or added, on one
// thread and two, in both of the kernel's splits (rows of C by blocks; columns of C with every
// thread packing all of dout, M < N), with short row blocks and an odd K. dout's values span
// 2^-11..2^11 so that a different summation order rounds differently (with values of one
// magnitude every order gives the same sums); the product itself is left to (a)-(c).
TEST_CASE("own bf16 kernels: the bias gradient summed while packing is column_sums' bits") {
  if (!sw::cpu::cpu_has_avx512_bf16()) return;
  const int saved = omp_get_max_threads();
  const int shapes[][3] = {{2048, 1152, 384}, {2048, 384, 1536}, {777, 130, 100},
                           {515, 300, 70},    {64, 33, 64},      {1, 64, 64}};  // K, M, N
  uint32_t x = 11;
  auto rnd = [&] {
    x = x * 1664525u + 1013904223u;
    return (float)((x >> 8) & 0xffff) / 32768.f - 1.f;
  };
  for (const auto& s : shapes)
    for (int threads : {1, 2})
      for (bool write : {true, false}) {
        const int K = s[0], M = s[1], N = s[2];
        INFO("K" << K << " M" << M << " N" << N << " threads " << threads << " write " << write);
        std::vector<uint16_t> d16((size_t)K * M), x16((size_t)K * N);
        for (auto& v : d16) v = f32_to_bf16(rnd() * std::exp2(11.f * rnd()));
        for (auto& v : x16) v = f32_to_bf16(rnd());
        std::vector<float> dw((size_t)M * N), db(M), want(M);
        for (int i = 0; i < M; ++i) db[i] = want[i] = rnd();
        sw::cpu::detail::column_sums(want.data(), d16.data(), K, M, write,
                                     [](uint16_t v) { return bf16_to_f32(v); });
        omp_set_num_threads(threads);
        REQUIRE(sw::cpu::detail::gemm_bf16_16_dw_db(M, N, K, d16.data(), M, x16.data(), N, 0.f,
                                                    dw.data(), N, db.data(), write));
        CHECK(std::memcmp(db.data(), want.data(), M * sizeof(float)) == 0);
      }
  omp_set_num_threads(saved);
}
