// The CUDA fp8 primitives (kernels/fp8_ops.h Fp8Kernels), registered for DeviceKind::CUDA at
// load time like the Ops (link the archive whole): one byte a value (__nv_fp8_e4m3 /
// __nv_fp8_e5m2), cuBLASLt's fp8 matmul. Everything runs on the bf16 Ops' compute stream, with
// scales in device memory (no host synchronisation).
//
//  amax      a grid-stride block reduction per block, then the blocks' maxima combined with
//            atomicMax on the bits (non-negative floats order as their bits: max is order-free,
//            so the result is deterministic); NaNs skipped (fmaxf).
//  scales    one thread: fp8_scale of the max of the amaxes (kernels/fp8_ops.h's formula).
//  quantize  x * scale, __nv_cvt_float_to_fp8 with __NV_SATFINITE (round to nearest even,
//            saturating to +-fp8_max, NaN kept: the host's round_fp8); transposed through
//            32 x 32 shared-memory tiles.
//  gemm      cuBLASLt, "TN": row-major D(M, N) = A(M, K) B(N, K)^T is column-major
//            D^T(N, M) = B^T A with matA = B (transposed, K-major) and matB = A (K-major): the
//            only layout the fp8 kernels take; the inverse scales through A/B_SCALE_POINTER,
//            fp32 compute, no fast accumulation (fp32 to the end, as the CPU twin). C and D of
//            one type (fp32, or bf16 with beta 0); the bias added by a kernel after the product
//            (into fp32 before a bf16 output is narrowed, through scratch). Sizes must be
//            multiples of 16 (takes(); others run the wrapped bf16 product).
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "core/alloc.h"
#include "core/error.h"
#include "kernels/cuda/lazy_load.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/fp8_ops.h"

namespace sw {

namespace {

// cuBLAS / cuBLASLt, loaded on first use (lazy_load.h).
inline const cuda::CublasApi& cublas() { return cuda::cublas_api(); }

constexpr size_t kLtWorkspace = size_t{32} << 20;

__device__ __forceinline__ float ld(const float* f, const uint16_t* h, size_t i) {
  return f ? f[i] : __uint_as_float(static_cast<uint32_t>(h[i]) << 16);
}

__global__ void amax_kernel(unsigned int* out, const float* f, const uint16_t* h, size_t n) {
  float m = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(ld(f, h, i)));
  __shared__ float sm[32];
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < (blockDim.x >> 5) ? sm[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0) atomicMax(out, __float_as_uint(m));
  }
}

__global__ void scales_kernel(float* s, const float* amaxes, int count, float fmax, bool pow2) {
  float m = 0.f;
  for (int i = 0; i < count; ++i) m = fmaxf(m, amaxes[i]);
  float sc = 1.f;
  if (m > 0.f && isfinite(m)) sc = fmax / (m < 1e-12f ? 1e-12f : m);
  if (pow2 && sc != 1.f) {  // fp8_scale's pow2: rounded down to a power of two (sc finite, > 0)
    int e = 0;
    frexpf(sc, &e);
    sc = ldexpf(1.f, e - 1);
  }
  s[0] = sc;
  s[1] = 1.f / sc;
}

__device__ __forceinline__ __nv_fp8_storage_t q8(float v, __nv_fp8_interpretation_t t) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, t);
}

__global__ void quant_kernel(__nv_fp8_storage_t* q, const float* f, const uint16_t* h, size_t n,
                             const float* s, __nv_fp8_interpretation_t t) {
  const float sc = s[0];
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    q[i] = q8(ld(f, h, i) * sc, t);
}

// (rows, cols) -> (cols, rows); blocks of 32 x 8 threads over 32 x 32 tiles.
__global__ void quant_t_kernel(__nv_fp8_storage_t* q, const float* f, const uint16_t* h, int rows,
                               int cols, const float* s, __nv_fp8_interpretation_t t) {
  __shared__ __nv_fp8_storage_t tile[32][33];
  const float sc = s[0];
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  for (int dy = threadIdx.y; dy < 32; dy += 8) {
    const int r = r0 + dy, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[dy][threadIdx.x] = q8(ld(f, h, size_t(r) * cols + c) * sc, t);
  }
  __syncthreads();
  for (int dy = threadIdx.y; dy < 32; dy += 8) {
    const int c = c0 + dy, r = r0 + threadIdx.x;
    if (r < rows && c < cols) q[size_t(c) * rows + r] = tile[threadIdx.x][dy];
  }
}

// D(M, N) (+)= bias(N): fp32 in place, or a bf16 output from fp32 scratch.
__global__ void bias_kernel(float* df, uint16_t* dh, const float* acc, const float* bias, int M,
                            int N) {
  const size_t n = size_t(M) * N;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float v = acc[i] + bias[i % N];
    if (df)
      df[i] = v;
    else
      dh[i] = cuda::f32_to_bf16_d(v);
  }
}

int grid_for(size_t n) {
  const size_t b = (n + 255) / 256;
  return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

cudaDataType_t fp8_type(Fp8Format f) {
  return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}
__nv_fp8_interpretation_t fp8_interp(Fp8Format f) {
  return f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}

class CudaFp8 final : public Fp8Kernels {
 public:
  size_t elem_bytes() const override { return 1; }

  void amax(float* out, Operand x, size_t n) const override {
    SW_CHECK(x.f32 || x.lp, "fp8 amax: no operand");
    cudaStream_t st = stream();
    SW_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), st));
    if (n == 0) return;
    amax_kernel<<<std::min(grid_for(n), 1024), 256, 0, st>>>(reinterpret_cast<unsigned int*>(out),
                                                             x.f32, x.f32 ? nullptr : x.lp, n);
    SW_CUDA_LAUNCHED();
  }

  void scales(float* s, const float* amaxes, int count, Fp8Format f, bool pow2) const override {
    scales_kernel<<<1, 1, 0, stream()>>>(s, amaxes, count, fp8_max(f), pow2);
    SW_CUDA_LAUNCHED();
  }

  void quantize(void* q, Fp8Format f, const float* s, Operand x, int rows, int cols,
                bool transpose) const override {
    SW_CHECK(x.f32 || x.lp, "fp8 quantize: no operand");
    cudaStream_t st = stream();
    auto* o = static_cast<__nv_fp8_storage_t*>(q);
    const uint16_t* h = x.f32 ? nullptr : x.lp;
    if (!transpose) {
      const size_t n = size_t(rows) * cols;
      quant_kernel<<<grid_for(n), 256, 0, st>>>(o, x.f32, h, n, s, fp8_interp(f));
    } else {
      const dim3 grid((cols + 31) / 32, (rows + 31) / 32), block(32, 8);
      quant_t_kernel<<<grid, block, 0, st>>>(o, x.f32, h, rows, cols, s, fp8_interp(f));
    }
    SW_CUDA_LAUNCHED();
  }

  bool takes(int M, int N, int K) const override {
    return M % 16 == 0 && N % 16 == 0 && K % 16 == 0;
  }

  void gemm(int M, int N, int K, const void* A, Fp8Format fa, const float* sa, const void* B,
            Fp8Format fb, const float* sb, const float* bias, const float* Cin, float beta,
            Out D) const override {
    SW_CHECK(D.f32 || D.lp, "fp8 gemm: no output");
    SW_CHECK(D.f32 || !Cin, "fp8 gemm: Cin only with an fp32 output");
    SW_CHECK(!(fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2), "fp8 gemm: E5M2 x E5M2");
    cudaStream_t st = stream();
    // With a bias, the product goes to fp32 (D's own fp32 form, or scratch for a bf16 D) and
    // the bias kernel finishes it.
    float* acc = D.f32;
    if (bias && !D.f32) acc = static_cast<float*>(scratch(4, sizeof(float) * size_t(M) * N));
    const bool out16 = !acc;
    if (Cin && Cin != acc) {
      SW_CUDA_CHECK(
          cudaMemcpyAsync(acc, Cin, sizeof(float) * size_t(M) * N, cudaMemcpyDeviceToDevice, st));
    }
    const float b = Cin ? beta : 0.f;
    Plan& p = plan(M, N, K, fa, fb, out16);
    const float one = 1.f;
    void* d = out16 ? static_cast<void*>(D.lp) : static_cast<void*>(acc);
    // matA = B (row-major N x K), matB = A: their inverse scales.
    const float* a_inv = sb + 1;
    const float* b_inv = sa + 1;
    SW_CUDA_CHECK(cublas().LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                    &a_inv, sizeof(a_inv)));
    SW_CUDA_CHECK(cublas().LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                    &b_inv, sizeof(b_inv)));
    SW_CUDA_CHECK(cublas().LtMatmul(lt(), p.desc, &one, B, p.la, A, p.lb, &b, d, p.lc, d, p.lc,
                                    &p.algo, ws_.data(), kLtWorkspace, st));
    if (bias) {
      const size_t n = size_t(M) * N;
      bias_kernel<<<grid_for(n), 256, 0, st>>>(D.f32, D.f32 ? nullptr : D.lp, acc, bias, M, N);
      SW_CUDA_LAUNCHED();
    }
  }

  void* scratch(int slot, size_t bytes) const override {
    SW_CHECK(slot >= 0 && slot < kSlots, "fp8 scratch: no such slot");
    Buffer& b = slots_[slot];
    if (b.bytes() < bytes) {
      b.release();
      b = Buffer(bytes + bytes / 4 + 256, Mem::Workspace, Device::cuda(device()));
    }
    return b.data();
  }

  std::shared_ptr<float> alloc_floats(size_t n) const override {
    auto* b =
        new Buffer(std::max<size_t>(n, 1) * sizeof(float), Mem::Workspace, Device::cuda(device()));
    SW_CUDA_CHECK(cudaMemsetAsync(b->data(), 0, b->bytes(), stream()));
    return std::shared_ptr<float>(b->f32(), [b](float*) { delete b; });
  }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  int device() const {
    begin();
    return dev_;
  }
  cudaStream_t stream() const {
    begin();
    return st_;
  }
  cublasLtHandle_t lt() const {
    begin();
    return lt_;
  }
  void begin() const {
    std::call_once(once_, [this] {
      dev_ = cuda_current_device();
      // The bf16 Ops' compute stream: the decorator's products order with the wrapped ops.
      st_ = static_cast<cudaStream_t>(
          ops_for(Device::cuda(dev_), DType::BF16).stream().native_handle());
      SW_CUDA_CHECK(cublas().LtCreate(&lt_));
      ws_ = Buffer(kLtWorkspace, Mem::Workspace, Device::cuda(dev_));
    });
  }

  Plan& plan(int M, int N, int K, Fp8Format fa, Fp8Format fb, bool out16) const {
    const auto key = std::make_tuple(M, N, K, int(fa), int(fb), int(out16));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    Plan p;
    const cudaDataType_t dt = out16 ? CUDA_R_16BF : CUDA_R_32F;
    SW_CUDA_CHECK(cublas().LtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    SW_CUDA_CHECK(
        cublas().LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof(tA)));
    SW_CUDA_CHECK(
        cublas().LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof(tB)));
    const int8_t fast = 0;  // fp32 accumulation to the end
    SW_CUDA_CHECK(cublas().LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                    sizeof(fast)));
    // The scale pointers' values are set per call; the heuristic needs them set (any device
    // pointer of the right alignment).
    const float* dummy = static_cast<const float*>(ws_.data());
    SW_CUDA_CHECK(cublas().LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                    &dummy, sizeof(dummy)));
    SW_CUDA_CHECK(cublas().LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                    &dummy, sizeof(dummy)));
    // matA: B as column-major (K, N), ld K; matB: A as (K, M), ld K; C / D: (N, M), ld N.
    SW_CUDA_CHECK(cublas().LtMatrixLayoutCreate(&p.la, fp8_type(fb), K, N, K));
    SW_CUDA_CHECK(cublas().LtMatrixLayoutCreate(&p.lb, fp8_type(fa), K, M, K));
    SW_CUDA_CHECK(cublas().LtMatrixLayoutCreate(&p.lc, dt, N, M, N));
    cublasLtMatmulPreference_t pref = nullptr;
    SW_CUDA_CHECK(cublas().LtMatmulPreferenceCreate(&pref));
    const size_t ws = kLtWorkspace;
    SW_CUDA_CHECK(cublas().LtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    const cublasStatus_t s = cublas().LtMatmulAlgoGetHeuristic(lt(), p.desc, p.la, p.lb, p.lc,
                                                               p.lc, pref, 1, &r, &found);
    cublas().LtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0)
      fail("kernels", "fp8: cuBLASLt offers no fp8 matmul for M " + std::to_string(M) + " N " +
                          std::to_string(N) + " K " + std::to_string(K) +
                          " (needs compute capability 8.9 or above)");
    p.algo = r.algo;
    return plans_.emplace(key, p).first->second;
  }

  mutable std::once_flag once_;
  mutable int dev_ = 0;
  mutable cudaStream_t st_ = nullptr;
  mutable cublasLtHandle_t lt_ = nullptr;
  mutable Buffer ws_;
  mutable Buffer slots_[kSlots];
  mutable std::mutex mu_;
  mutable std::map<std::tuple<int, int, int, int, int, int>, Plan> plans_;
};

struct Fp8Registrar {
  Fp8Registrar() {
    static const CudaFp8* k = new CudaFp8();  // never destroyed (as the Ops: process lifetime)
    register_fp8_kernels(DeviceKind::CUDA, k);
  }
} fp8_registrar;

}  // namespace

}  // namespace sw
