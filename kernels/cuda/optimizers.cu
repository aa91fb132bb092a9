// SGD (LARS's update with its trust ratio as `scale`) and Lamb's two elementwise halves: the
// formulas of the CPU twin (kernels/cpu/optimizers.cpp), one thread per element, grid-stride.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"

namespace sw::cuda {

namespace {
constexpr int kThreads = 256;

__global__ void sgd_k(float* param, const float* grad, float* m, size_t n, float lr, float mu,
                      float omd, bool nesterov, bool first, bool use_m, float wd, float scale,
                      float grad_mult) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
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

__global__ void lamb_prepare_k(const float* param, float* grad, float* m, float* v, size_t n,
                               float b1, float b2, float omb1, float omb2, float eps, float wd,
                               float grad_mult) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float g = grad[i] * grad_mult;
    const float mi = b1 * m[i] + omb1 * g;
    const float vi = b2 * v[i] + omb2 * g * g;
    m[i] = mi;
    v[i] = vi;
    grad[i] = mi / (sqrtf(vi) + eps) + wd * param[i];
  }
}

__global__ void add_scaled_k(float* y, float a, const float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    y[i] += a * x[i];
}
}  // namespace

void sgd(cudaStream_t s, float* param, const float* grad, float* m, size_t n, float lr,
         float momentum, float dampening, bool nesterov, float wd, float scale, int step,
         float grad_mult) {
  if (n == 0) return;
  const float omd = static_cast<float>(1.0 - static_cast<double>(dampening));
  sgd_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(param, grad, m, n, lr, momentum, omd,
                                                   nesterov, step <= 1, momentum != 0.f, wd,
                                                   scale, grad_mult);
  SW_CUDA_LAUNCHED();
}

void lamb_prepare(cudaStream_t s, const float* param, float* grad, float* m, float* v, size_t n,
                  float beta1, float beta2, float eps, float wd, float grad_mult) {
  if (n == 0) return;
  const float omb1 = static_cast<float>(1.0 - beta1), omb2 = static_cast<float>(1.0 - beta2);
  lamb_prepare_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(param, grad, m, v, n, beta1, beta2,
                                                            omb1, omb2, eps, wd, grad_mult);
  SW_CUDA_LAUNCHED();
}

void add_scaled(cudaStream_t s, float* y, float a, const float* x, size_t n) {
  if (n == 0) return;
  add_scaled_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(y, a, x, n);
  SW_CUDA_LAUNCHED();
}

}  // namespace sw::cuda
