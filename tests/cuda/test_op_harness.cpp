// The op harness (op_harness.h) exercised without a GPU: CPU bf16 Ops against CPU fp32 Ops for
// every op, the CPU's run-to-run determinism, and a deliberately wrong backend that the harness
// must catch (so a harness that compares nothing cannot pass).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstdio>

#include "kernels/ops.h"
#include "tests/cuda/op_harness.h"

using namespace swtest::harness;
using sw::Device;
using sw::DType;

namespace {

// SW_TEST_VERBOSE=1 prints every comparison (used to set the tolerances).
void report(const std::vector<Result>& results) {
  const bool verbose = std::getenv("SW_TEST_VERBOSE") != nullptr;
  for (const Result& r : results) {
    if (verbose) std::printf("%s\n", r.str().c_str());
    INFO(r.str());
    CHECK(r.ok);
  }
}

// CPU fp32 Ops with one op broken: gelu_forward adds 1e-3 to every output.
class BrokenGelu final : public sw::Ops {
 public:
  explicit BrokenGelu(const sw::Ops& base) : b_(base) {}
  sw::Device device() const override { return b_.device(); }
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) const override {
    b_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void linear_forward(float* out, const float* inp, const float* w, const float* b, int N, int C,
                      int OC) const override {
    b_.linear_forward(out, inp, w, b, N, C, OC);
  }
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, int N, int C, int OC) const override {
    b_.linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  }
  void embedding_forward(float* out, const int32_t* t, const float* wte, const float* wpe, int B,
                         int T, int C) const override {
    b_.embedding_forward(out, t, wte, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* t, int B,
                          int T, int C) const override {
    b_.embedding_backward(dwte, dwpe, dout, t, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) const override {
    b_.layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    b_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps) const override {
    b_.rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int N, int C) const override {
    b_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* w, const float* bias, int N,
                                  int C) const override {
    b_.residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C);
  }
  void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                const float* b, const float* w, int N, int C,
                                float eps) const override {
    b_.residual_rmsnorm_forward(res, out, rstd, a, b, w, N, C, eps);
  }
  void gelu_forward(float* out, const float* inp, size_t n) const override {
    b_.gelu_forward(out, inp, n);
    for (size_t i = 0; i < n; ++i) out[i] += 1e-3f;
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const override {
    b_.gelu_backward(dinp, inp, dout, n);
  }
  void swiglu_forward(float* out, const float* gu, int N, int F) const override {
    b_.swiglu_forward(out, gu, N, F);
  }
  void swiglu_backward(float* dgu, const float* dout, const float* gu, int N,
                       int F) const override {
    b_.swiglu_backward(dgu, dout, gu, N, F);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    b_.residual_forward(out, a, b, n);
  }
  void rope_forward(float* qkv, int B, int T, int H, int KVH, int hd, float th) const override {
    b_.rope_forward(qkv, B, T, H, KVH, hd, th);
  }
  void rope_backward(float* dqkv, int B, int T, int H, int KVH, int hd, float th) const override {
    b_.rope_backward(dqkv, B, T, H, KVH, hd, th);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H, int KVH,
                         int hd) const override {
    b_.attention_forward(out, lse, qkv, B, T, H, KVH, hd);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int B, int T, int H, int KVH,
                          int hd) const override {
    b_.attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
  }
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, const float* w,
                     const int32_t* t, int N, int C, int V, float gs) const override {
    return b_.lmhead_xent(loss, dx, dw, x, w, t, N, C, V, gs);
  }
  void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1, float b2,
             float eps, float wd, int step, float gm) const override {
    b_.adamw(p, g, m, v, n, lr, b1, b2, eps, wd, step, gm);
  }
  double sum_squares(const float* x, size_t n) const override { return b_.sum_squares(x, n); }
  void scale(float* x, float a, size_t n) const override { b_.scale(x, a, n); }
  void fill(float* x, float v, size_t n) const override { b_.fill(x, v, n); }
  void add_inplace(float* y, const float* x, size_t n) const override { b_.add_inplace(y, x, n); }
  void copy(float* d, const float* s, size_t n) const override { b_.copy(d, s, n); }
  void narrow(sw::DType dt, const float* s, void* d, size_t n) const override {
    b_.narrow(dt, s, d, n);
  }
  void widen(sw::DType dt, const void* s, float* d, size_t n) const override {
    b_.widen(dt, s, d, n);
  }
  void add_widened(sw::DType dt, const void* s, float* d, size_t n) const override {
    b_.add_widened(dt, s, d, n);
  }
  void round_to(sw::DType dt, float* x, size_t n) const override { b_.round_to(dt, x, n); }

 private:
  const sw::Ops& b_;
};

}  // namespace

TEST_CASE("op harness: the cases cover every op of sw::Ops") {
  const auto missing = uncovered(op_cases());
  for (const auto& op : missing) INFO("no case for " + op);
  CHECK(missing.empty());
}

TEST_CASE("op harness: CPU bf16 Ops match CPU fp32 Ops on every op") {
  const Backend ref = cpu_backend(sw::ops_for(Device::cpu(), DType::F32), "cpu-f32");
  const Backend cand = cpu_backend(sw::ops_for(Device::cpu(), DType::BF16), "cpu-bf16");
  const auto results = compare(ref, cand, /*lowp=*/true, op_cases());
  CHECK(results.size() > 150);
  report(results);
}

TEST_CASE("op harness: CPU fp32 Ops are bitwise deterministic") {
  const Backend be = cpu_backend(sw::ops_for(Device::cpu()), "cpu-f32");
  const auto bad = determinism(be, op_cases());
  for (const auto& b : bad) INFO("differs between runs: " + b);
  CHECK(bad.empty());
}

TEST_CASE("op harness: CPU fused residual norms equal the unfused pair bit for bit") {
  const auto bad = fused_norms_bitwise(cpu_backend(sw::ops_for(Device::cpu()), "cpu-f32"));
  for (const auto& b : bad) INFO("fused != unfused: " + b);
  CHECK(bad.empty());
}

TEST_CASE("op harness: a wrong op is caught, and only that op") {
  const Backend ref = cpu_backend(sw::ops_for(Device::cpu()), "cpu-f32");
  const BrokenGelu broken(sw::ops_for(Device::cpu()));
  const Backend cand = cpu_backend(broken, "broken-gelu");
  int failed = 0;
  for (const Result& r : compare(ref, cand, /*lowp=*/false, op_cases())) {
    INFO(r.str());
    if (r.case_name.rfind("gelu_forward", 0) == 0) {
      CHECK_FALSE(r.ok);
    } else {
      CHECK(r.ok);  // fp32 CPU against itself: NMSE 0
    }
    failed += !r.ok;
  }
  CHECK(failed == 3);  // the three gelu_forward sizes
}
