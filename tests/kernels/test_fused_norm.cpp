// Fused residual + norm (Ops::layernorm_forward / rmsnorm_forward of NormIn::residual): every
// output must be bit-identical (memcmp) to the unfused sequence residual_forward followed by
// layernorm_forward / rmsnorm_forward, for odd row widths (vector tails), row counts on both
// sides of the parallel threshold, several thread counts, the aliasing the models use
// (res == a, res == b), null statistics and a null bias, and through every compute precision's
// Ops (element-wise ops and norms are fp32 there too).
#include <omp.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using swtest::randv;
using swtest::same_bits;
using swtest::Vec;

struct Shape {
  int N, C;
};
// N*C below and above the norms' parallel threshold (16K elements); C odd, < 64 and > 64 lanes.
const Shape kShapes[] = {{1, 1}, {3, 63}, {7, 65}, {5, 127}, {37, 769}, {129, 200}, {64, 768}};
const int kThreads[] = {1, 2, 3};
// 0: res separate, 1: res == a, 2: res == b.
const int kAlias[] = {0, 1, 2};

template <class F>
void with_threads(int nt, F&& fn) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(nt);
  fn();
  omp_set_num_threads(prev);
}

const sw::Ops& ops_of(int p) {
  const sw::DType t[] = {sw::DType::F32, sw::DType::BF16, sw::DType::F16};
  return sw::ops_for(sw::Device::cpu(), t[p]);
}

}  // namespace

TEST_CASE("fused residual + layernorm is bit-identical to residual then layernorm",
          "[fused][layernorm]") {
  for (const Shape s : kShapes)
    for (int nt : kThreads)
      for (int alias : kAlias)
        for (int p = 0; p < 3; ++p)
          for (bool bias : {true, false}) {
            const size_t NC = size_t(s.N) * s.C;
            const Vec a0 = randv(NC, 11 + s.C, 2.f), b0 = randv(NC, 12 + s.N);
            const Vec w = randv(s.C, 13), bb = randv(s.C, 14);
            const float* bp = bias ? bb.data() : nullptr;
            INFO("N=" << s.N << " C=" << s.C << " threads=" << nt << " alias=" << alias
                      << " precision=" << p << " bias=" << bias);
            // Unfused reference with the plain CPU kernels.
            Vec res_ref(NC), out_ref(NC), mean_ref(s.N), rstd_ref(s.N);
            sw::cpu::residual_forward(res_ref.data(), a0.data(), b0.data(), NC);
            sw::cpu::layernorm_forward(out_ref.data(), mean_ref.data(), rstd_ref.data(),
                                       res_ref.data(), w.data(), bp, s.N, s.C);
            Vec a = a0, b = b0, sep(NC, -1.f), out(NC, -1.f), mean(s.N, -1.f), rstd(s.N, -1.f);
            float* res = alias == 1 ? a.data() : alias == 2 ? b.data() : sep.data();
            with_threads(nt, [&] {
              ops_of(p).layernorm_forward(out.data(), mean.data(), rstd.data(),
                                          sw::NormIn::residual(res, a.data(), b.data()), w.data(),
                                          bp, s.N, s.C);
            });
            const Vec resv(res, res + NC);
            CHECK(same_bits(resv, res_ref));
            CHECK(same_bits(out, out_ref));
            CHECK(same_bits(mean, mean_ref));
            CHECK(same_bits(rstd, rstd_ref));
            // Untouched input stays untouched.
            if (alias != 1) CHECK(same_bits(a, a0));
            if (alias != 2) CHECK(same_bits(b, b0));
            // Null statistics: same outputs.
            Vec res2(NC), out2(NC);
            with_threads(nt, [&] {
              ops_of(p).layernorm_forward(out2.data(), nullptr, nullptr,
                                          sw::NormIn::residual(res2.data(), a0.data(), b0.data()),
                                          w.data(), bp, s.N, s.C);
            });
            CHECK(same_bits(res2, res_ref));
            CHECK(same_bits(out2, out_ref));
          }
}

TEST_CASE("fused residual + rmsnorm is bit-identical to residual then rmsnorm",
          "[fused][rmsnorm]") {
  for (const Shape s : kShapes)
    for (int nt : kThreads)
      for (int alias : kAlias)
        for (int p = 0; p < 3; ++p) {
          const float eps = 1e-6f;
          const size_t NC = size_t(s.N) * s.C;
          const Vec a0 = randv(NC, 21 + s.C, 2.f), b0 = randv(NC, 22 + s.N);
          const Vec w = randv(s.C, 23);
          INFO("N=" << s.N << " C=" << s.C << " threads=" << nt << " alias=" << alias
                    << " precision=" << p);
          Vec res_ref(NC), out_ref(NC), rstd_ref(s.N);
          sw::cpu::residual_forward(res_ref.data(), a0.data(), b0.data(), NC);
          sw::cpu::rmsnorm_forward(out_ref.data(), rstd_ref.data(), res_ref.data(), w.data(), s.N,
                                   s.C, eps);
          Vec a = a0, b = b0, sep(NC, -1.f), out(NC, -1.f), rstd(s.N, -1.f);
          float* res = alias == 1 ? a.data() : alias == 2 ? b.data() : sep.data();
          with_threads(nt, [&] {
            ops_of(p).rmsnorm_forward(out.data(), rstd.data(),
                                      sw::NormIn::residual(res, a.data(), b.data()), w.data(), s.N,
                                      s.C, eps);
          });
          const Vec resv(res, res + NC);
          CHECK(same_bits(resv, res_ref));
          CHECK(same_bits(out, out_ref));
          CHECK(same_bits(rstd, rstd_ref));
          if (alias != 1) CHECK(same_bits(a, a0));
          if (alias != 2) CHECK(same_bits(b, b0));
          Vec res2(NC), out2(NC);
          with_threads(nt, [&] {
            ops_of(p).rmsnorm_forward(out2.data(), nullptr,
                                      sw::NormIn::residual(res2.data(), a0.data(), b0.data()),
                                      w.data(), s.N, s.C, eps);
          });
          CHECK(same_bits(res2, res_ref));
          CHECK(same_bits(out2, out_ref));
        }
}

TEST_CASE("fused residual + norms on an empty batch", "[fused]") {
  Vec w(4, 1.f);
  sw::cpu::residual_layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                      w.data(), nullptr, 0, 4);
  sw::cpu::residual_rmsnorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, w.data(), 0, 4,
                                    1e-5f);
  SUCCEED();
}
