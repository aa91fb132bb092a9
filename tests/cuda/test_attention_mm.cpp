// The cuBLAS attention path's orchestration (kernels/cuda/attention_mm.h) without a GPU: the
// same template over a host twin of its backend, whose products are plain strided-batched
// loops over the 16-bit operands and whose row kernels are serial copies of attention_mm.cu's
// formulas. Against the CPU's bf16 / fp16 attention (which it must follow rounding point for
// rounding point) on the op harness's attention cases (sequences up to 530: several 256-key
// softmax tiles), with the query chunks also forced small so that every chunk boundary,
// stride and kv-group member is exercised. What this cannot check: the CUDA kernels' own
// indexing (thread loops, block reductions) and cuBLAS's argument order, which
// test_cuda_ops checks on a GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/dtype.h"
#include "core/env.h"
#include "kernels/cuda/attention_mm.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/ops.h"
#include "tests/common/forwarding_ops.h"
#include "tests/cuda/op_harness.h"

using namespace swtest::harness;
using sw::Device;
using sw::DType;

namespace {

struct HostBe {
  DType dt;
  int forced = 0;
  mutable std::vector<uint16_t> w16[4]{};
  mutable std::vector<float> w32[4]{};

  uint16_t to16(float f) const { return dt == DType::BF16 ? sw::f32_to_bf16(f) : sw::f32_to_f16(f); }
  float from16(uint16_t h) const { return dt == DType::BF16 ? sw::bf16_to_f32(h) : sw::f16_to_f32(h); }
  // Fresh contents each call (NaN-filled), so reading what was never written shows.
  uint16_t* ws16(int k, size_t n) const {
    w16[k].assign(std::max<size_t>(n, 1), 0x7fc1);
    return w16[k].data();
  }
  float* ws32(int k, size_t n) const {
    w32[k].assign(std::max<size_t>(n, 1), NAN);
    return w32[k].data();
  }
  size_t chunk_budget() const { return size_t{256} << 20; }
  int forced_chunk() const { return forced; }
  void pack(const float* src, int B, int T, int ld, int col0, int nh, int hd, uint16_t* dst) const {
    for (size_t b = 0; b < size_t(B); ++b)
      for (int h = 0; h < nh; ++h)
        for (int t = 0; t < T; ++t)
          for (int d = 0; d < hd; ++d)
            dst[((b * nh + h) * T + t) * hd + d] =
                to16(src[(b * T + t) * ld + col0 + size_t(h) * hd + d]);
  }
  // Row-major C(M, N) = op(A) op(B) + beta C per batch member, fp32 sums of exact products.
  void gemm(bool ta, bool tb, int M, int N, int K, const uint16_t* A, int lda, size_t sa,
            const uint16_t* B, int ldb, size_t sb, float beta, float* C, int ldc, size_t sc,
            size_t batch) const {
    for (size_t z = 0; z < batch; ++z) {
      const uint16_t* a = A + z * sa;
      const uint16_t* bm = B + z * sb;
      float* c = C + z * sc;
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          float s = 0.f;
          for (int k = 0; k < K; ++k) {
            const float av = from16(ta ? a[size_t(k) * lda + m] : a[size_t(m) * lda + k]);
            const float bv = from16(tb ? bm[size_t(n) * ldb + k] : bm[size_t(k) * ldb + n]);
            s += av * bv;
          }
          float& cv = c[size_t(m) * ldc + n];
          cv = beta == 0.f ? s : beta * cv + s;
        }
    }
  }
  void softmax_fwd(const float* S, uint16_t* P, float* alpha, float* ml, size_t rows, int nq,
                   int ldS, int kend, int q0, int tiles, float scale) const {
    for (size_t row = 0; row < rows; ++row) {
      const int i = int(row % nq), vis = std::min(q0 + i + 1, kend);
      const float* s = S + row * ldS;
      uint16_t* p = P + row * ldS;
      float m = -INFINITY, l = 0.f;
      for (int t = 0; t < tiles; ++t) {
        const int j0 = t * sw::attn_mm::kTile, j1 = std::min(kend, j0 + sw::attn_mm::kTile);
        const int nv = std::max(0, std::min(vis, j1) - j0);
        float a = 1.f;
        if (nv > 0) {
          float mx = -INFINITY;
          for (int j = 0; j < nv; ++j) mx = std::max(mx, s[j0 + j]);
          const float mnew = std::max(m, mx * scale);
          float sum = 0.f;
          for (int j = 0; j < j1 - j0; ++j) {
            float v = 0.f;
            if (j < nv) v = std::exp(s[j0 + j] * scale - mnew), sum += v;
            p[j0 + j] = to16(v);
          }
          if (t > 0 && mnew > m) a = std::exp(m - mnew), l *= a;
          l += sum;
          m = mnew;
        } else {
          for (int j = 0; j < j1 - j0; ++j) p[j0 + j] = 0;
        }
        alpha[row * tiles + t] = a;
      }
      for (int j = kend; j < ldS; ++j) p[j] = 0;
      ml[2 * row] = m, ml[2 * row + 1] = l;
    }
  }
  void combine(const float* Ot, const float* alpha, const float* ml, float* out, float* lse,
               size_t rows, int nq, int hd, int tiles, int T, int H, int q0) const {
    for (size_t row = 0; row < rows; ++row) {
      const int i = int(row % nq);
      const size_t z = row / nq, b = z / H;
      const int h = int(z % H);
      const float inv = 1.0f / ml[2 * row + 1];
      float* o = out + (b * T + q0 + i) * size_t(H) * hd + size_t(h) * hd;
      for (int d = 0; d < hd; ++d) {
        float acc = Ot[row * hd + d];
        for (int t = 1; t < tiles; ++t)
          acc = acc * alpha[row * tiles + t] + Ot[(t * rows + row) * hd + d];
        o[d] = acc * inv;
      }
      lse[z * T + q0 + i] = ml[2 * row] + std::log(ml[2 * row + 1]);
    }
  }
  void rowdot(const float* dout, const float* out, float* D, int B, int T, int H, int hd) const {
    for (size_t r = 0; r < size_t(B) * H * T; ++r) {
      const size_t z = r / T, b = z / H;
      const int t = int(r % T), h = int(z % H);
      const size_t off = (b * T + t) * size_t(H) * hd + size_t(h) * hd;
      float s = 0.f;
      for (int d = 0; d < hd; ++d) s += dout[off + d] * out[off + d];
      D[r] = s;
    }
  }
  void softmax_bwd(const float* S, const float* dP, uint16_t* P, uint16_t* dS, const float* lse,
                   const float* D, size_t rows, int nq, int ldS, int kend, int q0, int T,
                   float scale) const {
    for (size_t row = 0; row < rows; ++row) {
      const int i = int(row % nq), vis = std::min(q0 + i + 1, kend);
      const size_t z = row / nq;
      const float li = lse[z * T + q0 + i], di = D[z * T + q0 + i];
      for (int j = 0; j < ldS; ++j) {
        float p = 0.f, ds = 0.f;
        if (j < vis) {
          p = std::exp(S[row * ldS + j] * scale - li);
          ds = scale * p * (dP[row * ldS + j] - di);
        }
        P[row * ldS + j] = to16(p);
        dS[row * ldS + j] = to16(ds);
      }
    }
  }
  void unpack(const float* dQn, const float* dKn, const float* dVn, float* dqkv, int B, int T,
              int H, int KVH, int hd) const {
    const int R = (H + 2 * KVH) * hd;
    for (size_t b = 0; b < size_t(B); ++b)
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < R; ++c) {
          const int head = c / hd, d = c % hd;
          float v;
          if (head < H)
            v = dQn[((b * H + head) * T + t) * hd + d];
          else if (head < H + KVH)
            v = dKn[((b * KVH + (head - H)) * T + t) * hd + d];
          else
            v = dVn[((b * KVH + (head - H - KVH)) * T + t) * hd + d];
          dqkv[(b * T + t) * R + c] += v;
        }
  }
  void zero(float* p, size_t n) const { std::fill(p, p + n, 0.f); }
};

// The CPU's low-precision Ops with attention through the orchestration over HostBe (fp32
// forms; the 16-bit ones through them, as CudaOps' cuBLAS path takes them, and a written
// dqkv zeroed first, then added into, as the orchestration adds).
class Twin final : public swtest::ForwardingOps {
 public:
  Twin(const sw::Ops& base, DType dt, int forced) : ForwardingOps(base), be_{dt, forced, {}, {}} {}
  void attention_forward(sw::Out out, float* lse, sw::Operand qkv, int B, int T, int H, int KVH,
                         int hd) const override {
    if (out.lp || qkv.lp) return attention_forward_through_f32(out, lse, qkv, B, T, H, KVH, hd);
    sw::attn_mm::forward(be_, out.f32, lse, qkv.f32, B, T, H, KVH, hd);
  }
  void attention_backward(sw::GradIn dqkv, sw::Operand dout, sw::Operand qkv, sw::Operand out,
                          const float* lse, int B, int T, int H, int KVH, int hd) const override {
    if (dqkv.lp || dout.lp || qkv.lp || out.lp)
      return attention_backward_through_f32(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
    if (dqkv.write) fill(dqkv.f32, 0.f, size_t(B) * T * (H + 2 * KVH) * hd);
    sw::attn_mm::backward(be_, dqkv.f32, dout.f32, qkv.f32, out.f32, lse, B, T, H, KVH, hd);
  }

 private:
  HostBe be_;
};

}  // namespace

TEST_CASE("attention_mm: chunk sizes stay within the budget, in multiples of 64") {
  using sw::attn_mm::chunk_rows;
  CHECK(chunk_rows(64, 2048, 6, 0, size_t{256} << 20, 0) == 320);  // 341 rows fit: 320
  CHECK(chunk_rows(64, 8192, 12, 0, size_t{256} << 20, 0) == 64);
  CHECK(chunk_rows(1, 100, 6, 0, size_t{256} << 20, 0) == 100);  // capped at T
  CHECK(chunk_rows(1, 100, 6, 0, size_t{256} << 20, 7) == 7);    // forced
  const int nq = chunk_rows(32, 4096, 12, 0, size_t{256} << 20, 0);
  CHECK(nq % 64 == 0);
  CHECK(size_t(32) * nq * 12 * 4096 <= (size_t{256} << 20));
}

TEST_CASE("attention_mm: the orchestration over a host twin equals the CPU's bf16 / fp16 "
          "attention") {
  // The CUDA kernels round where the CPU's fp32-FMA attention path does; the CPU's native bf16
  // path (vdpbf16ps pairs, another summation order) is checked against that path within its
  // bounds in test_bf16. So the reference here is the FMA path.
  sw::cpu::set_attention_bf16_native(false);
  struct Restore {
    ~Restore() { sw::cpu::set_attention_bf16_native(true); }
  } restore;
  std::vector<OpCase> cs;
  for (auto& c : op_cases())
    if (c.op.rfind("attention", 0) == 0) cs.push_back(c);
  REQUIRE(cs.size() >= 16);  // (the harness's shapes include T = 300 and 530: several tiles)
  const bool verbose = sw::env_flag("SHARDWISE_TEST_VERBOSE");
  for (DType t : {DType::BF16, DType::F16})
    for (int forced : {0, 64, 7}) {  // whole sequences; chunks of 64 and of 7 query rows
      const sw::Ops& lowp = sw::ops_for(Device::cpu(), t);
      const Twin twin(lowp, t, forced);
      for (const Result& r : compare(cpu_backend(lowp, "cpu-lowp"), cpu_backend(twin, "twin"),
                                     /*lowp=*/false, cs)) {
        if (verbose) std::printf("%s chunk %d %s\n", sw::dtype_name(t), forced, r.str().c_str());
        INFO(sw::dtype_name(t) << " chunk " << forced << " " << r.str());
        CHECK(r.ok);
      }
    }
}
