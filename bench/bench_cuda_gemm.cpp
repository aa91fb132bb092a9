// bench_cuda_gemm: the GEMMs of the GPU benchmark's two models, timed in the ways cuBLAS can run
// them, to find why the H200 run of 2026-11-27 measured Shardwise's forward products at ~495
// TFLOP/s and its backward ones at ~683 (op times, same shapes transposed).
//
// Shapes: each linear layer of the 1.3B Llama (d 2048, d_ff 5632, 8192 tokens a step) and of
// GPT-2 124M (d 768, d_ff 3072, 16384 tokens), forward (out = x W^T), backward dinp (dout W)
// and dW (dout^T x), as CudaOps calls them (row-major, kernels/cuda/cuda_ops.cu's gemm16), plus
// the LM head's 1024-row chunks (CudaOps' kChunkRows) and 2048- and 4096-row ones. Ways:
//   ex_f32     cublasGemmEx, bf16 operands, fp32 output, CUBLAS_GEMM_DEFAULT: what CudaOps runs
//   ex_f32_ws  the same with a 32 MiB workspace set on the handle (cublasSetWorkspace)
//   ex_bf16    bf16 output (what PyTorch's bf16 linear writes)
//   lt_f32     cuBLASLt, fp32 output, 32 MiB workspace, the heuristic's first algorithm
//   lt_f32_best  the fastest of the heuristic's first 8 algorithms (timed here)
//   lt_bf16    cuBLASLt, bf16 output, the heuristic's first algorithm
// Prints TFLOP/s per shape and way, and each way's time over all shapes of a model as a share
// of ex_f32's (below 1: faster). Dense bf16 peak for the MFU figures: 989 TFLOP/s (H100/H200).
// Without a GPU it says so and exits 0 (it is a benchmark, not a test).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

#define CK(x)                                                                                 \
  do {                                                                                        \
    auto e_ = (x);                                                                            \
    if (static_cast<int>(e_) != 0) {                                                          \
      std::fprintf(stderr, "bench_cuda_gemm: %s failed (%d) at line %d\n", #x,               \
                   static_cast<int>(e_), __LINE__);                                           \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

struct Shape {
  std::string model, name;
  bool ta, tb;  // row-major C(M,N) = op(A) op(B), as CudaOps::gemm16
  int M, N, K;
};

std::vector<Shape> shapes() {
  std::vector<Shape> s;
  auto linear = [&](const std::string& model, const std::string& name, int N, int C, int OC) {
    s.push_back({model, name + " fwd", false, true, N, OC, C});     // out = x w^T
    s.push_back({model, name + " dinp", false, false, N, C, OC});   // dinp = dout w
    s.push_back({model, name + " dw", true, false, OC, C, N});      // dw = dout^T x
  };
  const int NL = 8192, d = 2048, f = 5632;
  linear("llama", "qkv", NL, d, 3 * d);
  linear("llama", "o", NL, d, d);
  linear("llama", "gate_up", NL, d, 2 * f);
  linear("llama", "down", NL, f, d);
  linear("llama", "lm_head chunk", 1024, d, 32000);
  linear("llama", "lm_head 2048 rows", 2048, d, 32000);  // larger chunks: worth their memory?
  linear("llama", "lm_head 4096 rows", 4096, d, 32000);
  const int NG = 16384, g = 768, gf = 3072;
  linear("gpt2", "qkv", NG, g, 3 * g);
  linear("gpt2", "proj", NG, g, g);
  linear("gpt2", "fc", NG, g, gf);
  linear("gpt2", "fcproj", NG, gf, g);
  linear("gpt2", "lm_head chunk", 1024, g, 50304);
  return s;
}

struct Ctx {
  cublasHandle_t blas;     // as created (the library's own workspace)
  cublasHandle_t blas_ws;  // with the 32 MiB workspace NVIDIA recommends for Hopper
  cublasLtHandle_t lt;
  cudaStream_t st;
  void* ws;
  size_t ws_bytes;
  cudaEvent_t e0, e1;
};

// Median of `iters` timed runs after 3 warm-ups, in milliseconds.
template <class F>
double time_ms(Ctx& c, F&& run, int iters = 15) {
  for (int i = 0; i < 3; ++i) run();
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(c.e0, c.st));
    run();
    CK(cudaEventRecord(c.e1, c.st));
    CK(cudaEventSynchronize(c.e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, c.e0, c.e1));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Column-major view of the row-major product (cuda_ops.cu's gemm16): C^T = op(B)^T op(A)^T.
struct ColMajor {
  cublasOperation_t opa, opb;
  int m, n, k, lda, ldb, ldc;
};
ColMajor col(const Shape& s) {
  const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
  return {s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, s.N, s.M, s.K,
          ldb, lda, s.N};
}

double run_ex(Ctx& c, cublasHandle_t h, const Shape& s, const void* A, const void* B, void* C,
              bool bf16_out) {
  const ColMajor m = col(s);
  const float alpha = 1.f, beta = 0.f;
  return time_ms(c, [&] {
    CK(cublasGemmEx(h, m.opa, m.opb, m.m, m.n, m.k, &alpha, B, CUDA_R_16BF, m.lda, A,
                    CUDA_R_16BF, m.ldb, &beta, C, bf16_out ? CUDA_R_16BF : CUDA_R_32F, m.ldc,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
}

// cuBLASLt: the heuristic's first algorithm (best = false) or the fastest of its first 8.
double run_lt(Ctx& c, const Shape& s, const void* A, const void* B, void* C, bool bf16_out,
              bool best, int* n_algos) {
  const ColMajor m = col(s);
  const cudaDataType_t out_t = bf16_out ? CUDA_R_16BF : CUDA_R_32F;
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &m.opa, sizeof(m.opa)));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &m.opb, sizeof(m.opb)));
  const bool ta = m.opa == CUBLAS_OP_T, tb = m.opb == CUBLAS_OP_T;
  cublasLtMatrixLayout_t la, lb, lc;
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? m.k : m.m, ta ? m.m : m.k, m.lda));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? m.n : m.k, tb ? m.k : m.n, m.ldb));
  CK(cublasLtMatrixLayoutCreate(&lc, out_t, m.m, m.n, m.ldc));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &c.ws_bytes, sizeof(c.ws_bytes)));
  cublasLtMatmulHeuristicResult_t res[8];
  int got = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(c.lt, desc, la, lb, lc, lc, pref, best ? 8 : 1, res, &got));
  *n_algos = got;
  const float alpha = 1.f, beta = 0.f;
  double best_ms = 1e30;
  for (int i = 0; i < got; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const double ms = time_ms(c, [&] {
      CK(cublasLtMatmul(c.lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &res[i].algo,
                        c.ws, c.ws_bytes, c.st));
    });
    best_ms = std::min(best_ms, ms);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  return got > 0 ? best_ms : -1;
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("bench_cuda_gemm: no GPU here; nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int cublas_ver = 0;
  Ctx c{};
  CK(cublasCreate(&c.blas));
  CK(cublasGetVersion(c.blas, &cublas_ver));
  CK(cublasLtCreate(&c.lt));
  CK(cudaStreamCreate(&c.st));
  CK(cublasSetStream(c.blas, c.st));
  CK(cublasCreate(&c.blas_ws));
  CK(cublasSetStream(c.blas_ws, c.st));
  CK(cudaEventCreate(&c.e0));
  CK(cudaEventCreate(&c.e1));
  c.ws_bytes = size_t{32} << 20;
  CK(cudaMalloc(&c.ws, c.ws_bytes));
  CK(cublasSetWorkspace(c.blas_ws, c.ws, c.ws_bytes));
  std::printf("bench_cuda_gemm: %s, cuBLAS %d; median of 15 after 3 warm-ups; TFLOP/s\n",
              prop.name, cublas_ver);

  const std::vector<Shape> ss = shapes();
  size_t most = 0;
  for (const Shape& s : ss)
    most = std::max({most, size_t(s.M) * s.K, size_t(s.K) * s.N, size_t(s.M) * s.N});
  void *A, *B, *C;
  CK(cudaMalloc(&A, most * 2));
  CK(cudaMalloc(&B, most * 2));
  CK(cudaMalloc(&C, most * 4));
  {  // operands: small random bf16 values (a fixed pattern; speed does not depend on them)
    std::vector<__nv_bfloat16> h(most);
    uint32_t x = 12345;
    for (auto& v : h) {
      x = x * 1664525u + 1013904223u;
      v = __float2bfloat16(static_cast<float>((x >> 8) & 0xffff) / 65536.f - 0.5f);
    }
    CK(cudaMemcpy(A, h.data(), most * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, h.data(), most * 2, cudaMemcpyHostToDevice));
  }

  const char* ways[] = {"ex_f32", "ex_f32_ws", "ex_bf16", "lt_f32", "lt_f32_best", "lt_bf16"};
  constexpr int W = 6;
  std::printf("%-8s %-22s %6s %6s %6s", "model", "product", "M", "N", "K");
  for (const char* w : ways) std::printf(" %11s", w);
  std::printf("\n");
  std::string model;
  std::vector<double> total(W, 0.0);
  auto summary = [&] {
    if (model.empty()) return;
    std::printf("%-8s %-43s", model.c_str(), "all shapes: time / ex_f32's");
    for (int w = 0; w < W; ++w) std::printf(" %11.3f", total[w] / total[0]);
    std::printf("\n");
    std::fill(total.begin(), total.end(), 0.0);
  };
  for (const Shape& s : ss) {
    if (s.model != model) summary(), model = s.model;
    const double flop = 2.0 * s.M * s.N * s.K;
    double ms[W];
    int algos = 0, unused = 0;  // algos: how many the best-of-8 way tried
    ms[0] = run_ex(c, c.blas, s, A, B, C, false);
    ms[1] = run_ex(c, c.blas_ws, s, A, B, C, false);
    ms[2] = run_ex(c, c.blas, s, A, B, C, true);
    ms[3] = run_lt(c, s, A, B, C, false, false, &unused);
    ms[4] = run_lt(c, s, A, B, C, false, true, &algos);
    ms[5] = run_lt(c, s, A, B, C, true, false, &unused);
    std::printf("%-8s %-22s %6d %6d %6d", s.model.c_str(), s.name.c_str(), s.M, s.N, s.K);
    for (int w = 0; w < W; ++w) {
      std::printf(" %11.1f", ms[w] > 0 ? flop / (ms[w] * 1e-3) / 1e12 : 0.0);
      total[w] += ms[w] > 0 ? ms[w] : ms[0];
    }
    std::printf("   (%d Lt algos)\n", algos);
  }
  summary();
  return 0;
}
