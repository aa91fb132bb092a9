// AdamW with torch.optim.AdamW semantics (decoupled weight decay, bias-corrected moments, eps
// added after the square root of the corrected second moment). One fused, memory-bound pass:
// reads param, grad, m, v and writes param, m, v. Elementwise, so results do not depend on the
// thread count.
//
// Note: the loop vectorises only when the build passes -fno-math-errno; otherwise GCC keeps a
// scalar errno path for sqrt of a negative number (v >= 0 here, so it is never taken) and the
// loop runs ~2x slower. The `optimize` attribute/pragma does not lift this in GCC 12.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

namespace sw::cpu {

namespace {
constexpr size_t kParallelMin = size_t{1} << 15;  // elements
}

// Per element, in PyTorch's order of operations:
//   g = grad * grad_mult
//   p *= 1 - lr * wd
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   p -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// which is p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p) with p the value before the step.
// Scalar coefficients are formed in double (as PyTorch does in Python) and rounded once.
namespace {
// K 0: no 16-bit copy; 1 bf16, 2 fp16: p16 = narrow(K, the updated param) in the same pass.
// G: the gradients read rounded to bf16 (round_to's bits), a one-rank unit's pending rounding
// (Ops::rounds_grads_on_read) done here instead of in a pass of its own.
template <int K, bool G = false>
void adamw_t(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
             float beta2, float eps, float wd, int step, float grad_mult, uint16_t* p16) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), step);
  const float step_size = static_cast<float>(static_cast<double>(lr) / bc1);
  const float inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * wd);
  const detail::AdamMoments mom(beta1, beta2);
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    const float g = G ? detail::bf16_rounded(grad[i]) : grad[i];
    mom.update(g * grad_mult, m[i], v[i]);
    const float denom = std::sqrt(v[i]) * inv_bc2_sqrt + eps;
    const float p = param[i] * decay - step_size * (m[i] / denom);
    param[i] = p;
    if constexpr (K != 0) p16[i] = detail::to_kind<K>(p);
  }
}
}  // namespace

void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
           float beta2, float eps, float wd, int step, float grad_mult) {
  adamw_t<0>(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult, nullptr);
}

// The updated parameters' 16-bit copy written in the same pass (Ops::adamw's copies: the
// compute copies of a unit's weights): narrow(dt, param) after adamw, one pass instead of two
// over param (~0.6% of the small bf16 model's step on the CPU).
void adamw16(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
             float beta2, float eps, float wd, int step, float grad_mult, DType dt,
             uint16_t* param16, DType grad_dt) {
  SW_CHECK(grad_dt == DType::F32 || grad_dt == DType::BF16,
           "adamw16: gradients read as they are or rounded to bf16");
  const bool r = grad_dt == DType::BF16;
  if (dt == DType::BF16 && r)
    adamw_t<1, true>(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult, param16);
  else if (dt == DType::BF16)
    adamw_t<1>(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult, param16);
  else if (r)
    adamw_t<2, true>(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult, param16);
  else
    adamw_t<2>(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult, param16);
}

}  // namespace sw::cpu
