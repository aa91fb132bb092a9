// A host model of the CUDA vocabulary-parallel cross-entropy (kernels/cuda/tp_kernels.cu,
// CudaOps::xent_shard_*) against the CPU's Ops (kernels/cpu/tp_kernels.cpp), on every machine.
// The per-element arithmetic is the kernels' own code (kernels/cuda/tp_rows.h, built here by
// the host compiler): each row's 512 threads' online maximum and sum of exponentials in their
// strides (four logits per access where V is a multiple of 4, as the kernel chooses for
// aligned rows), the combine's row formula, the gradient's; around it this file models what
// only the GPU runs: the block's max and sum (a sequential sum in place of the warp
// butterflies' tree) and the products (sequential fp32 sums in place of cuBLAS), with the
// operands and g rounded to 16 bits where the Ops are BF16 or F16, as CudaOps narrows them.
// What it guards: the CUDA formulas (the online rescaling, the combine, the target's
// subtraction, the rounding points) give the CPU's results at the fp32 tolerances the op
// harness demands of the real kernels on a GPU (tests/cuda/test_cuda_ops.cpp); what it cannot
// show: that the kernels' launches and indexing compute this model (only a GPU run can).
// Measured here (SHARDWISE_TEST_VERBOSE=1 prints them): NMSE <= 9e-13 (fp32, BF16, F16) against
// the 1e-9 asked; without the online sum's rescaling, 2e-6..0.12.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/dtype.h"
#include "core/env.h"
#include "kernels/cuda/tp_rows.h"
#include "kernels/ops.h"
#include "tests/cuda/op_harness.h"

using namespace swtest::harness;
using sw::DType;
namespace tp = sw::cuda::tp;

namespace {

constexpr int kRowThreads = 512;  // tp_kernels.cu's block per row

float rnd(DType dt, float x) {
  if (dt == DType::BF16) return sw::bf16_to_f32(sw::f32_to_bf16(x));
  if (dt == DType::F16) return sw::f16_to_f32(sw::f32_to_f16(x));
  return x;
}
Vec rounded(DType dt, const Vec& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = rnd(dt, v[i]);
  return r;
}

// logits(N, V) = h w^T, fp32 sums in order (cuBLAS's in another).
Vec logits_of(const Vec& h, const Vec& w, int N, int C, int V) {
  Vec z(size_t(N) * V);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      float s = 0.f;
      for (int c = 0; c < C; ++c) s += h[size_t(n) * C + c] * w[size_t(v) * C + c];
      z[size_t(n) * V + v] = s;
    }
  return z;
}

// xent_shard_stats_k<W> on one row.
template <int W>
void stats_row(const float* row, int V, int32_t t, int64_t v_lo, float* st) {
  std::vector<float> mx(kRowThreads, -INFINITY), sum(kRowThreads, 0.f);
  for (int th = 0; th < kRowThreads; ++th)
    for (int v = W * th; v < V; v += W * kRowThreads) {
      float x[W];
      for (int k = 0; k < W; ++k) x[k] = row[v + k];
      tp::online_step<W>(mx[th], sum[th], x);
    }
  float rmx = -INFINITY;
  for (float m : mx) rmx = std::max(rmx, m);
  float s = 0.f;
  for (int th = 0; th < kRowThreads; ++th) s += tp::rescaled(mx[th], sum[th], rmx);
  st[0] = rmx;
  st[1] = s;
  st[2] = tp::in_shard(t, v_lo, V) ? row[int64_t(t) - v_lo] : 0.f;
}

struct Shape {
  int N, C, V;
};

struct Inputs {
  Vec h, w, dh0, dw0;
  IVec t;
  Inputs(const Shape& s, uint64_t seed) {
    Rng r(seed);
    h = r.normal(size_t(s.N) * s.C);
    w = r.normal(size_t(s.V) * s.C, 0.5f);
    t = r.ints(size_t(s.N), 0, 3 * s.V);  // this shard: [V, 2V)
    for (size_t i = 3; i < t.size(); i += 5) t[i] = -1;
    dh0 = Vec(h.size(), 0.f);  // (adding into non-zero values: the op harness's cases)
    dw0 = Vec(w.size(), 0.f);
  }
};

double report(const char* what, const Shape& s, DType dt, double e) {
  if (sw::env_flag("SHARDWISE_TEST_VERBOSE"))
    std::printf("%s %s N=%d C=%d V=%d: nmse %.3e\n", what, sw::dtype_name(dt), s.N, s.C, s.V, e);
  return e;
}

std::vector<double> wide(const Vec& v) { return std::vector<double>(v.begin(), v.end()); }

}  // namespace

TEST_CASE("tp twin: the CUDA shard cross-entropy's model matches the CPU's Ops (fp32, BF16, F16)") {
  // V odd (the one-wide kernel) and multiples of 4 (four-wide), past one stride of 512 threads.
  const Shape shapes[] = {{13, 24, 67}, {37, 16, 64}, {5, 8, 1031}, {6, 8, 2052}};
  uint64_t seed = 7;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), dt);
    for (const Shape& s : shapes) {
      INFO(sw::dtype_name(dt) << " N=" << s.N << " C=" << s.C << " V=" << s.V);
      const Inputs in(s, seed++);
      const int64_t v_lo = s.V;
      const float gs = 1.f / s.N;
      // CudaOps: h and w narrowed once per call (BF16), fp32 logits of the rounded values.
      const Vec hr = rounded(dt, in.h), wr = rounded(dt, in.w);
      const Vec z = logits_of(hr, wr, s.N, s.C, s.V);

      // Pass 1, the stats: the model against the CPU.
      Vec st(size_t(s.N) * 3);
      for (int n = 0; n < s.N; ++n) {
        const float* row = &z[size_t(n) * s.V];
        if (s.V % 4 == 0)
          stats_row<4>(row, s.V, in.t[n], v_lo, &st[size_t(n) * 3]);
        else
          stats_row<1>(row, s.V, in.t[n], v_lo, &st[size_t(n) * 3]);
      }
      Vec st_cpu(st.size());
      ops.xent_shard_stats(st_cpu.data(), in.h.data(), in.w.data(), in.t.data(), v_lo, s.N, s.C,
                           s.V);
      CHECK(report("stats", s, dt, nmse(wide(st), wide(st_cpu))) <= 1e-9);

      // The combine of this shard with two others' made-up stats (rank 1 of 3): the model's
      // row formula against the CPU's, from the same stats (the CPU's).
      Vec all(size_t(3) * s.N * 3);
      Rng r(seed * 31);
      for (int n = 0; n < s.N; ++n)
        for (int k = 0; k < 3; ++k) {
          float* p = &all[(size_t(k) * s.N + n) * 3];
          if (k == 1) {
            std::copy_n(&st_cpu[size_t(n) * 3], 3, p);
            continue;
          }
          p[0] = static_cast<float>(4 * r.uniform());
          p[1] = static_cast<float>(1 + 50 * r.uniform());
          p[2] = 0.f;
        }
      Vec lse(size_t(s.N)), loss(size_t(s.N)), lse_cpu(lse.size()), loss_cpu(lse.size());
      double total = 0;
      for (int n = 0; n < s.N; ++n) {
        tp::combine_row(all.data(), size_t(s.N) * 3, 3, n, in.t[n], lse.data(), loss.data());
        total += loss[n];
      }
      double total_cpu = 0;
      ops.xent_shard_combine(&total_cpu, lse_cpu.data(), loss_cpu.data(), all.data(),
                             in.t.data(), 3, s.N);
      CHECK(report("combine lse", s, dt, nmse(wide(lse), wide(lse_cpu))) <= 1e-12);
      CHECK(report("combine loss", s, dt, nmse(wide(loss), wide(loss_cpu))) <= 1e-12);
      CHECK(std::fabs(total - total_cpu) <= 1e-6 * std::fabs(total_cpu));

      // Pass 2, the backward from the CPU's lse: g per the model (narrowed where BF16, as the
      // row kernel writes it 16-bit), dh += g w, dw += g^T h, fp32 sums in order.
      Vec g(z.size());
      for (int n = 0; n < s.N; ++n)
        for (int v = 0; v < s.V; ++v) {
          const int32_t t = in.t[n];
          const float x = t < 0 ? 0.f
                                : tp::shard_grad(z[size_t(n) * s.V + v], lse_cpu[n], gs,
                                                 tp::in_shard(t, v_lo, s.V) && t - v_lo == v);
          g[size_t(n) * s.V + v] = rnd(dt, x);
        }
      Vec dh = in.dh0, dw = in.dw0;
      for (int n = 0; n < s.N; ++n)
        for (int c = 0; c < s.C; ++c) {
          float a = 0.f;
          for (int v = 0; v < s.V; ++v) a += g[size_t(n) * s.V + v] * wr[size_t(v) * s.C + c];
          dh[size_t(n) * s.C + c] += a;
        }
      for (int v = 0; v < s.V; ++v)
        for (int c = 0; c < s.C; ++c) {
          float a = 0.f;
          for (int n = 0; n < s.N; ++n) a += g[size_t(n) * s.V + v] * hr[size_t(n) * s.C + c];
          dw[size_t(v) * s.C + c] += a;
        }
      Vec dh_cpu = in.dh0, dw_cpu = in.dw0;
      ops.xent_shard_backward(dh_cpu.data(), dw_cpu.data(), in.h.data(), in.w.data(),
                              lse_cpu.data(), in.t.data(), v_lo, s.N, s.C, s.V, gs);
      CHECK(report("backward dh", s, dt, nmse(wide(dh), wide(dh_cpu))) <= 1e-9);
      CHECK(report("backward dw", s, dt, nmse(wide(dw), wide(dw_cpu))) <= 1e-9);
    }
  }
}
