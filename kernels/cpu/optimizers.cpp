// SGD (momentum, Nesterov; LARS's update with its trust ratio as `scale`) and Lamb's two
// elementwise halves, with torch.optim.SGD's and DeepSpeed's FusedLamb's order of operations
// (sharding/sharded_model.h OptimizerParams has the formulas). Elementwise, so results do not
// depend on the thread count.
#include <cmath>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

namespace sw::cpu {

namespace {
constexpr size_t kParallelMin = size_t{1} << 15;  // elements
}

void sgd(float* param, const float* grad, float* m, size_t n, float lr, float momentum,
         float dampening, bool nesterov, float wd, float scale, int step, float grad_mult) {
  const float mu = momentum, omd = static_cast<float>(1.0 - static_cast<double>(dampening));
  const bool first = step <= 1, use_m = momentum != 0.f;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    float d = grad[i] * grad_mult + wd * param[i];
    d *= scale;
    if (use_m) {
      const float mi = first ? d : mu * m[i] + omd * d;
      m[i] = mi;
      d = nesterov ? d + mu * mi : mi;
    }
    param[i] -= lr * d;
  }
}

void lamb_prepare(const float* param, float* grad, float* m, float* v, size_t n, float beta1,
                  float beta2, float eps, float wd, float grad_mult) {
  const detail::AdamMoments mom(beta1, beta2);
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    mom.update(grad[i] * grad_mult, m[i], v[i]);
    grad[i] = m[i] / (std::sqrt(v[i]) + eps) + wd * param[i];
  }
}

void add_scaled(float* y, float a, const float* x, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace sw::cpu
