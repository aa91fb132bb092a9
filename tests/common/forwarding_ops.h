// An Ops that forwards every op to another (tests): derive and override the ops a test
// changes (a deliberately broken op, an emulation of another backend's arithmetic); an
// override sees every form of its op (kernels/ops.h). lmhead_xent_into and round_copy keep
// Ops' defaults (in terms of lmhead_xent, and copy / round_to / narrow), so they reach an
// override of the op they are made of; lmhead_xent_into then needs host memory.
#pragma once
#include "kernels/forwarding_ops.h"

namespace swtest {

class ForwardingOps : public sw::ForwardingOps {
 public:
  explicit ForwardingOps(const sw::Ops& base) : sw::ForwardingOps(base), base_(base) {}
  // Ops' own defaults, not the base's (see above): a test's override of an op reaches them.
  bool fuses_product_residual() const override { return sw::Ops::fuses_product_residual(); }
  bool rounds_grads_on_read(sw::DType dt) const override {
    return sw::Ops::rounds_grads_on_read(dt);
  }
  bool prefers_lp_operands() const override { return sw::Ops::prefers_lp_operands(); }
  void lmhead_xent_into(double* total, float* loss, float* dx, float* dw, const float* x,
                        sw::Operand w, const int32_t* targets, int N, int C, int V,
                        float grad_scale) const override {
    sw::Ops::lmhead_xent_into(total, loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }
  void round_copy(sw::DType dt, float* dst, const float* src, size_t n,
                  uint16_t* dst16) const override {
    sw::Ops::round_copy(dt, dst, src, n, dst16);
  }

 protected:
  const sw::Ops& base_;
};

}  // namespace swtest
