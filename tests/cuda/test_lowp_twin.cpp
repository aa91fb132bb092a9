// A host model of the CUDA backend's bf16 / fp16 attention and LM head
// (kernels/cuda/ attention.cu's low-precision kernels, cuda_ops.cu's
// lmhead_xent): the same rounding points, the CUDA forward's 256-key softmax
// tiles (kCpuFwdBK there), expf / logf, fma where nvcc contracts, sequential
// fp32 sums in place of the warp butterflies and cuBLAS. It runs on every
// machine against the CPU's bf16 / fp16 Ops (kernels/cpu/attention.cpp,
// lmhead.cpp) at the fp32 tolerances, which is what test_cuda_ops demands of
// the real kernels on a GPU. What it guards: if the CPU changes where it rounds
// (or its softmax tile, kFwdBK), this test fails and attention.cu must follow;
// what it cannot show: that the CUDA kernels compute what this model says (only
// test_cuda_ops on a GPU can). Measured here: NMSE <= 6e-14 (bf16 attention),
// <= 1.4e-10 (fp16 attention backward: one rounding flip), <= 6e-13 (LM head);
// leaving out the rounding of P gives 3-4e-7, of dS 7e-7..1e-6, 32-key softmax
// tiles 4.5e-8 (T = 70).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/dtype.h"
#include "core/env.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/ops.h"
#include "tests/common/forwarding_ops.h"
#include "tests/cuda/op_harness.h"

using namespace swtest::harness;
using sw::Device;
using sw::DType;

namespace {

constexpr int kCudaFwdTile = 256;  // attention.cu's kCpuFwdBK
DType g_dt = DType::BF16;

float rnd(float x) {
  return g_dt == DType::BF16 ? sw::bf16_to_f32(sw::f32_to_bf16(x))
                             : sw::f16_to_f32(sw::f32_to_f16(x));
}
// attention.cu attn_fwd_lowp_k: per 256-key tile, scores, their max, then P rounded.
void emu_attn_fwd(float* out, float* lse, const float* qkv, int B, int T, int H, int KVH, int hd) {
  const int R = (H + 2 * KVH) * hd, rep = H / KVH;
  const float scale = 1.0f / std::sqrt((float)hd);
  const int TILE = kCudaFwdTile;
  std::vector<float> q(hd), acc(hd), S(TILE);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const int g = h / rep;
        for (int d = 0; d < hd; ++d)
          q[d] = rnd(qkv[((size_t)b * T + t) * R + h * hd + d]), acc[d] = 0;
        float m = -INFINITY, l = 0;
        for (int j0 = 0; j0 <= t; j0 += TILE) {
          const int nv = std::min(t + 1, j0 + TILE) - j0;
          float smax = -INFINITY;
          for (int c = 0; c < nv; ++c) {
            const float* k = qkv + ((size_t)b * T + j0 + c) * R + (H + g) * hd;
            float s = 0;
            for (int d = 0; d < hd; ++d) s += q[d] * rnd(k[d]);
            S[c] = s;
            smax = std::max(smax, s);
          }
          const float mnew = std::max(m, smax * scale);
          float sum = 0;
          for (int c = 0; c < nv; ++c) {
            const float p = std::exp(std::fmaf(S[c], scale, -mnew));
            sum += p;
            S[c] = rnd(p);
          }
          const float corr = std::exp(m - mnew);
          l = std::fmaf(l, corr, sum);
          for (int d = 0; d < hd; ++d) acc[d] *= corr;
          for (int c = 0; c < nv; ++c) {
            const float* v = qkv + ((size_t)b * T + j0 + c) * R + (H + KVH + g) * hd;
            for (int d = 0; d < hd; ++d) acc[d] = std::fmaf(S[c], rnd(v[d]), acc[d]);
          }
          m = mnew;
        }
        const float inv = 1.f / l;
        for (int d = 0; d < hd; ++d) out[((size_t)b * T + t) * H * hd + h * hd + d] = acc[d] * inv;
        lse[((size_t)b * H + h) * T + t] = m + std::log(l);
      }
}
// attention.cu attn_bwd_dq_k / attn_bwd_dkv_k<DT>: D fp32 from the unrounded dO and O;
// rounded P for dV, rounded dS = (scale P)(dP - D) for dQ and dK.
void emu_attn_bwd(float* dqkv, const float* dout, const float* qkv, const float* out,
                  const float* lse, int B, int T, int H, int KVH, int hd) {
  const int R = (H + 2 * KVH) * hd, CO = H * hd, rep = H / KVH;
  const float scale = 1.0f / std::sqrt((float)hd);
  auto Q = [&](int b, int t, int h, int d) {
    return rnd(qkv[((size_t)b * T + t) * R + h * hd + d]);
  };
  auto K = [&](int b, int t, int g, int d) {
    return rnd(qkv[((size_t)b * T + t) * R + (H + g) * hd + d]);
  };
  auto Vv = [&](int b, int t, int g, int d) {
    return rnd(qkv[((size_t)b * T + t) * R + (H + KVH + g) * hd + d]);
  };
  auto dO = [&](int b, int t, int h, int d) {
    return rnd(dout[((size_t)b * T + t) * CO + h * hd + d]);
  };
  std::vector<float> D((size_t)B * H * T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        float s = 0;
        for (int d = 0; d < hd; ++d)
          s += dout[((size_t)b * T + t) * CO + h * hd + d] *
               out[((size_t)b * T + t) * CO + h * hd + d];
        D[((size_t)b * H + h) * T + t] = s;
      }
  auto pds = [&](int b, int h, int t, int j, float* pr, float* dsr) {
    const int g = h / rep;
    float s = 0, dp = 0;
    for (int d = 0; d < hd; ++d) s += Q(b, t, h, d) * K(b, j, g, d);
    for (int d = 0; d < hd; ++d) dp += dO(b, t, h, d) * Vv(b, j, g, d);
    const float L = lse[((size_t)b * H + h) * T + t], Dt = D[((size_t)b * H + h) * T + t];
    const float p = std::exp(std::fmaf(s, scale, -L));
    const float ds = scale * p * (dp - Dt);
    *pr = rnd(p);
    *dsr = rnd(ds);
  };
  std::vector<float> acc(hd), acc2(hd);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        const int g = h / rep;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int j = 0; j <= t; ++j) {
          float p, ds;
          pds(b, h, t, j, &p, &ds);
          for (int d = 0; d < hd; ++d) acc[d] = std::fmaf(ds, K(b, j, g, d), acc[d]);
        }
        for (int d = 0; d < hd; ++d) dqkv[((size_t)b * T + t) * R + h * hd + d] += acc[d];
      }
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < KVH; ++g)
      for (int j = 0; j < T; ++j) {
        std::fill(acc.begin(), acc.end(), 0.f);
        std::fill(acc2.begin(), acc2.end(), 0.f);
        for (int h = g * rep; h < (g + 1) * rep; ++h)
          for (int t = j; t < T; ++t) {
            float p, ds;
            pds(b, h, t, j, &p, &ds);
            for (int d = 0; d < hd; ++d) {
              acc2[d] = std::fmaf(p, dO(b, t, h, d), acc2[d]);
              acc[d] = std::fmaf(ds, Q(b, t, h, d), acc[d]);
            }
          }
        for (int d = 0; d < hd; ++d) {
          dqkv[((size_t)b * T + j) * R + (H + g) * hd + d] += acc[d];
          dqkv[((size_t)b * T + j) * R + (H + KVH + g) * hd + d] += acc2[d];
        }
      }
}
// cuda_ops.cu lmhead_xent: fp32 logits of rounded x, w; xent_rows_k's softmax; rounded dlogits.
double emu_lmhead(float* loss, float* dx, float* dw, const float* x, const float* w,
                  const int32_t* tg, int N, int C, int V, float gs) {
  std::vector<float> lg(V);
  double total = 0;
  for (int n = 0; n < N; ++n) {
    for (int v = 0; v < V; ++v) {
      float s = 0;
      for (int c = 0; c < C; ++c)
        s = std::fmaf(rnd(x[(size_t)n * C + c]), rnd(w[(size_t)v * C + c]), s);
      lg[v] = s;
    }
    const int t = tg[n];
    float rl = 0;
    if (t >= 0) {
      float mx = -INFINITY;
      for (int v = 0; v < V; ++v) mx = std::max(mx, lg[v]);
      float sum = 0;
      for (int v = 0; v < V; ++v) sum += std::exp(lg[v] - mx);
      rl = mx + std::log(sum) - lg[t];
      const float k = gs / sum;
      for (int v = 0; v < V; ++v) {
        const float p = std::exp(lg[v] - mx) * k;
        lg[v] = rnd(v == t ? p - gs : p);
      }
    } else
      std::fill(lg.begin(), lg.end(), 0.f);
    if (loss) loss[n] = rl;
    total += rl;
    if (dx)
      for (int c = 0; c < C; ++c) {
        float s = 0;
        for (int v = 0; v < V; ++v) s = std::fmaf(lg[v], rnd(w[(size_t)v * C + c]), s);
        dx[(size_t)n * C + c] += s;
      }
    if (dw)
      for (int v = 0; v < V; ++v)
        for (int c = 0; c < C; ++c)
          dw[(size_t)v * C + c] =
              std::fmaf(lg[v], rnd(x[(size_t)n * C + c]), dw[(size_t)v * C + c]);
  }
  return total;
}
// The CPU low-precision Ops with attention and the LM head replaced by the
// emulation (attention's 16-bit forms through its fp32 ones, a written dqkv zeroed first).
class Emu final : public swtest::ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  void attention_forward(sw::Out out, float* lse, sw::Operand qkv, int B, int T, int H, int KVH,
                         int hd) const override {
    if (out.lp || qkv.lp) return attention_forward_through_f32(out, lse, qkv, B, T, H, KVH, hd);
    emu_attn_fwd(out.f32, lse, qkv.f32, B, T, H, KVH, hd);
  }
  void attention_backward(sw::GradIn dqkv, sw::Operand dout, sw::Operand qkv, sw::Operand out,
                          const float* lse, int B, int T, int H, int KVH, int hd) const override {
    if (dqkv.lp || dout.lp || qkv.lp || out.lp)
      return attention_backward_through_f32(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
    if (dqkv.write) fill(dqkv.f32, 0.f, size_t(B) * T * (H + 2 * KVH) * hd);
    emu_attn_bwd(dqkv.f32, dout.f32, qkv.f32, out.f32, lse, B, T, H, KVH, hd);
  }
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, sw::Operand w,
                     const int32_t* t, int N, int C, int V, float gs) const override {
    std::vector<float> wide;  // a 16-bit weight alone: its values, as CUDA's products read them
    if (!w.f32) {
      wide.resize(size_t(V) * size_t(C));
      widen(compute(), w.lp, wide.data(), wide.size());
    }
    return emu_lmhead(loss, dx, dw, x, w.f32 ? w.f32 : wide.data(), t, N, C, V, gs);
  }
};

}  // namespace

TEST_CASE(
    "lowp twin: a model of the CUDA bf16/fp16 attention and LM head "
    "matches the CPU's") {
  // The CUDA kernels round where the CPU's fp32-FMA attention path does; the CPU's native bf16
  // path (vdpbf16ps pairs, another summation order) is checked against that path within its
  // bounds in test_bf16. So the reference here is the FMA path.
  sw::cpu::set_attention_bf16_native(false);
  struct Restore {
    ~Restore() { sw::cpu::set_attention_bf16_native(true); }
  } restore;
  const bool verbose = sw::env_flag("SHARDWISE_TEST_VERBOSE");
  for (DType t : {DType::BF16, DType::F16}) {
    g_dt = t;
    const sw::Ops& lowp = sw::ops_for(Device::cpu(), t);
    const Emu emu(lowp);
    std::vector<OpCase> cs;
    for (auto& c : op_cases())
      if (c.op.rfind("attention", 0) == 0 || c.op == "lmhead_xent") cs.push_back(c);
    REQUIRE(cs.size() >= 16);
    for (const Result& r : compare(cpu_backend(lowp, "cpu-lowp"), cpu_backend(emu, "model"),
                                   /*lowp=*/false, cs)) {
      if (verbose) std::printf("%s %s\n", sw::dtype_name(t), r.str().c_str());
      INFO(sw::dtype_name(t) << " " << r.str());
      CHECK(r.ok);
    }
  }
}
