// The op harness (op_harness.h) exercised without a GPU: CPU bf16 Ops against CPU fp32 Ops for
// every op, the CPU's run-to-run determinism, and a deliberately wrong backend that the harness
// must catch (so a harness that compares nothing cannot pass).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstdio>

#include "core/alloc.h"
#include "core/env.h"
#include "kernels/ops.h"
#include "tests/common/forwarding_ops.h"
#include "tests/cuda/op_harness.h"

using namespace swtest::harness;
using sw::Device;
using sw::DType;

namespace {

// SHARDWISE_TEST_VERBOSE=1 prints every comparison (used to set the tolerances).
void report(const std::vector<Result>& results) {
  const bool verbose = sw::env_flag("SHARDWISE_TEST_VERBOSE");
  for (const Result& r : results) {
    if (verbose) std::printf("%s\n", r.str().c_str());
    INFO(r.str());
    CHECK(r.ok);
  }
}

// CPU fp32 Ops with one op broken: gelu_forward adds 1e-3 to every fp32 output.
class BrokenGelu final : public swtest::ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  void gelu_forward(sw::Out out, sw::Operand inp, size_t n) const override {
    base_.gelu_forward(out, inp, n);
    if (out.f32)
      for (size_t i = 0; i < n; ++i) out.f32[i] += 1e-3f;
  }
};

// CPU fp32 Ops with the shard cross-entropy's backward scaled by 1.001 (a wrong grad_scale).
class BrokenShardXent final : public swtest::ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  void xent_shard_backward(float* dh, sw::GradOut dw, const float* h, sw::Operand w,
                           const float* lse, const int32_t* targets, int64_t v_lo, int N, int C,
                           int V, float grad_scale) const override {
    base_.xent_shard_backward(dh, dw, h, w, lse, targets, v_lo, N, C, V, grad_scale * 1.001f);
  }
};

// The CPU's Ops taking the Ops' shared forms through fp32 ones where a backend may take them
// (CudaOps' attention paths other than cuDNN's; AdamW's copies and the sums of rounded values
// through rounded copies in scratch; round_copy's default, copy + round_to + narrow): the
// CPU's own forms' bits, case for case.
class ThroughF32 final : public swtest::ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  void attention_forward(sw::Out out, float* lse, sw::Operand qkv, int B, int T, int H, int KVH,
                         int hd) const override {
    if (out.lp || qkv.lp) return attention_forward_through_f32(out, lse, qkv, B, T, H, KVH, hd);
    base_.attention_forward(out, lse, qkv, B, T, H, KVH, hd);
  }
  void attention_backward(sw::GradIn dqkv, sw::Operand dout, sw::Operand qkv, sw::Operand out,
                          const float* lse, int B, int T, int H, int KVH, int hd) const override {
    if (dqkv.lp || dout.lp || qkv.lp || out.lp)
      return attention_backward_through_f32(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
    base_.attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
  }
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr,
             float beta1, float beta2, float eps, float wd, int step, float grad_mult,
             const sw::AdamWCopies& copies = {}) const override {
    if (copies.dt != DType::F32)
      return adamw_through_copies(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step,
                                  grad_mult, copies);
    base_.adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult);
  }
  void sgd(float* param, const float* grad, float* m, size_t n, float lr, float momentum,
           float dampening, bool nesterov, float wd, float scale, int step,
           float grad_mult) const override {
    base_.sgd(param, grad, m, n, lr, momentum, dampening, nesterov, wd, scale, step, grad_mult);
  }
  void lamb_prepare(const float* param, float* grad, float* m, float* v, size_t n, float beta1,
                    float beta2, float eps, float wd, float grad_mult) const override {
    base_.lamb_prepare(param, grad, m, v, n, beta1, beta2, eps, wd, grad_mult);
  }
  void add_scaled(float* y, float a, const float* x, size_t n) const override {
    base_.add_scaled(y, a, x, n);
  }
  void sums_of_squares(const float* const* xs, const size_t* ns, int k, double* out,
                       sw::SumsTo to, DType dt = DType::F32) const override {
    if (dt != DType::F32) return sums_rounded_through_copies(dt, xs, ns, k, out);
    base_.sums_of_squares(xs, ns, k, out, to);
  }
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

TEST_CASE("op harness: the simulated device equals the CPU bit for bit on every op") {
  // Its ops are the CPU's behind device memory the host cannot touch, so every case (the
  // device-memory results of sums_of_squares and lmhead_xent_into included) must give the
  // CPU's bits: NMSE exactly 0.
  const auto up = [](void* d, const void* h, size_t n) {
    sw::copy_bytes(d, Device::sim(0), h, Device::cpu(), n);
  };
  const auto down = [](void* h, const void* d, size_t n) {
    sw::copy_bytes(h, Device::cpu(), d, Device::sim(0), n);
  };
  for (DType t : {DType::F32, DType::BF16}) {
    const Backend ref = cpu_backend(sw::ops_for(Device::cpu(), t), "cpu");
    const Backend sim{"sim", &sw::ops_for(Device::sim(0), t), up, down};
    const auto results = compare(ref, sim, /*lowp=*/false, op_cases());
    CHECK(results.size() > 150);
    for (const Result& r : results) {
      INFO(sw::dtype_name(t) << " " << r.str());
      CHECK(r.nmse == 0.0);
    }
  }
}

TEST_CASE("op harness: paired forms equal their references: written gradients (never reading "
          "dinp), round_copy, 16-bit forms") {
  // The CPU's own kernels in every precision, and the Ops' shared through-fp32 forms
  // (ThroughF32), which must also give the CPU's own forms' bits. The destination starts as NaN.
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    const sw::Ops& ops = sw::ops_for(Device::cpu(), t);
    const ThroughF32 through(ops);
    for (const Backend& be : {cpu_backend(ops, "cpu"), cpu_backend(through, "through-f32")}) {
      const auto bad = paired_forms_exact(be, op_cases());
      for (const auto& b : bad)
        INFO(be.name + " " + sw::dtype_name(t) + ": set != acc on zeros: " + b);
      CHECK(bad.empty());
    }
    for (const Result& r : compare(cpu_backend(ops, "cpu"), cpu_backend(through, "through-f32"),
                                   /*lowp=*/false, op_cases())) {
      INFO(sw::dtype_name(t) << " " << r.str());
      CHECK(r.nmse == 0.0);
    }
  }
  // A written gradient that read its destination would have turned the NaN into the output.
  const Backend ref = cpu_backend(sw::ops_for(Device::cpu()), "cpu-f32");
  for (const Result& r : compare(ref, ref, /*lowp=*/false, op_cases())) {
    INFO(r.str());
    CHECK(r.ok);
  }
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

TEST_CASE("op harness: a wrong tensor-parallel op is caught, and only that op") {
  const Backend ref = cpu_backend(sw::ops_for(Device::cpu()), "cpu-f32");
  const BrokenShardXent broken(sw::ops_for(Device::cpu()));
  int failed = 0;
  for (const Result& r : compare(ref, cpu_backend(broken, "broken-xent"), false, op_cases())) {
    INFO(r.str());
    const bool grad = r.case_name.rfind("xent_shard_backward", 0) == 0;
    CHECK(r.ok != grad);  // every gradient it writes fails (NMSE ~1e-6 against 1e-9), nothing else
    failed += !r.ok;
  }
  CHECK(failed == 4 * 8);  // four shapes, {add: dh, dw, dw only, dh only}, {set: four}
}
