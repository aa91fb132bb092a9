// CPU implementations of kernels/ops.h, as plain functions (llm.c style). Semantics, shapes
// and the "backward accumulates" rule are documented on the Ops methods; these mirror them
// one-to-one. Multi-threaded with OpenMP (static schedules, fixed-order reductions, so results
// are bit-identical run to run for a fixed thread count).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/ops.h"  // RopeSpec

namespace sw::cpu {

// gemm.cpp (OpenBLAS)
void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void linear_forward(float* out, const float* inp, const float* w, const float* b, int N, int C,
                    int OC);
// dinp_beta: dinp = dinp_beta * dinp + dout @ w (1: the Ops' +=; 0: a written dinp's =,
// GradIn::set:
// dinp never read). dw_beta likewise for dw; db_write: db = colsum (its old values not read).
void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC, float dinp_beta = 1.f,
                     float dw_beta = 1.f, bool db_write = false);

// gemm_bf16.cpp: reduced-precision products. Operands are rounded to bf16 / fp16 (round to
// nearest even, as core/dtype.h f32_to_bf16 / f32_to_f16: fp16 overflow gives +-inf) and the
// products accumulated in fp32; everything else (bias, db) stays fp32. t = F32 calls the fp32
// functions above. Three paths give the same exact products summed in different orders
// (gemm_bf16.cpp): Native = AVX512-BF16 vdpbf16ps kernels (BF16 only), Fused = AVX-512 FMA
// kernels rounding while packing, Emulated = rounded copies + sgemm. Auto resolves to
// lowp_auto_path(t); a forced path throws where the CPU lacks it (and Native for F16).
// OneDnn = oneDNN's bf16 matmul on bf16 copies of the operands (BF16 only, AVX-512). With
// SHARDWISE_LOWP_PATH=tuned, Auto chooses per shape for BF16: on the first call of each (M, N,
// K, transposes) it times the own kernel (lowp_own_path: Native or Fused) against OneDnn on
// that call's operands and keeps the faster for the process (native|fused|emulated|onednn force
// one path).
enum class LowpPath { Auto, Native, Fused, Emulated, OneDnn };
bool cpu_has_avx512_bf16();  // the CPU has AVX512-BF16 (Native possible)
bool cpu_has_avx512();       // the CPU has AVX-512F/BW (Fused possible)
bool bf16_native();          // Auto runs Native for BF16 (faster than FMA, or forced)
LowpPath lowp_auto_path(DType t);  // Auto's path for t (fixed for the process)
bool lowp_per_shape(DType t);      // Auto chooses between lowp_own_path and OneDnn per shape
// The own kernel for t: Native where BF16 runs vdpbf16ps (bf16_native), else Fused where
// AVX-512 exists, else Emulated. What the per-shape choice times against OneDnn.
LowpPath lowp_own_path(DType t);
// Whether every product of dtype t goes to oneDNN (Auto resolves to OneDnn, no per-shape
// choice): the path that reads bf16 operands as they are (detail::gemm_bf16_onednn).
bool lowp_onednn(DType t);
// The per-shape choice made for that shape so far (Auto: not yet called), with the best times
// measured (seconds) when it was made and the own kernel they were measured on (own_path).
LowpPath lowp_shape_choice(bool ta, bool tb, int M, int N, int K, double* t_own = nullptr,
                           double* t_onednn = nullptr, LowpPath* own_path = nullptr);
void gemm_lowp(DType t, bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
               int lda, const float* B, int ldb, float beta, float* C, int ldc,
               LowpPath path = LowpPath::Auto);
void linear_forward_lowp(DType t, float* out, const float* inp, const float* w, const float* b,
                         int N, int C, int OC);
void linear_backward_lowp(DType t, float* dinp, float* dw, float* db, const float* dout,
                          const float* inp, const float* w, int N, int C, int OC,
                          float dinp_beta = 1.f, float dw_beta = 1.f, bool db_write = false);
// The same with operands that may be 16-bit already (t's values; the Ops' 16-bit operands):
// each of inp / dout / w is given fp32, 16-bit (inp16 / dout16 / w16), or both (then the same
// values: the fp32 one is exactly the 16-bit one widened). The oneDNN path reads a 16-bit form
// where there is one, in place; the paths that round while packing read the fp32 form, a
// 16-bit-only operand widened into per-thread scratch first (the emulated path widens inp16 /
// dout16 in its one rounding pass; db sums dout's values, widened where 16-bit only).
void linear_forward_lowp16(DType t, float* out, const float* inp, const uint16_t* inp16,
                           const float* w, const uint16_t* w16, const float* b, int N, int C,
                           int OC);
void linear_backward_lowp16(DType t, float* dinp, float* dw, float* db, const float* dout,
                            const uint16_t* dout16, const float* inp, const uint16_t* inp16,
                            const float* w, const uint16_t* w16, int N, int C, int OC,
                            float dinp_beta, float dw_beta = 1.f, bool db_write = false);
// The same with the 16-bit output (out16 / dinp16, written: t's values) formed in the product
// itself where the path can (oneDNN: its bf16 output, gemm_bf16_onednn's rounding): true;
// false, nothing written, on the other paths (the caller computes fp32 and narrows).
bool linear_forward_lowp16_to16(DType t, uint16_t* out16, const float* inp, const uint16_t* inp16,
                                const float* w, const uint16_t* w16, const float* b, int N, int C,
                                int OC);
bool linear_backward_lowp16_to16(DType t, uint16_t* dinp16, float* dw, float* db,
                                 const float* dout, const uint16_t* dout16, const float* inp,
                                 const uint16_t* inp16, const float* w, const uint16_t* w16,
                                 int N, int C, int OC, float dw_beta, bool db_write);
// dst[i] = src[i] rounded to t and back to fp32 (dst may equal src; F32 copies).
void round_to(DType t, float* dst, const float* src, size_t n);

// embedding.cpp
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C);
// The same from a 16-bit table (BF16 / F16 values, widened row by row).
void embedding_forward_lp(DType dt, float* out, const int32_t* tokens, const uint16_t* wte16,
                          const float* wpe, int B, int T, int C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C);

// norm.cpp
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C);
// dinp16 (may be null): also written with narrow(dt, dinp) of the sums, row by row in the same
// pass (the Ops' residual gradient in both forms); the same for rmsnorm_backward.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C,
                        uint16_t* dinp16 = nullptr, DType dt = DType::BF16);
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                     float eps);
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C, uint16_t* dinp16 = nullptr,
                      DType dt = DType::BF16);
// Floats of the calling thread's partials buffer a backward of N x C rows grows it to (both:
// LayerNorm's dw and db; else RMSNorm's dw alone).
size_t norm_partial_floats(int N, int C, bool both);
void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* w, const float* bias, int N, int C);
void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b,
                              const float* w, int N, int C, float eps);
// The four forwards with out narrowed to dt in the same pass (the Ops' 16-bit outputs).
void layernorm_forward_lp(DType dt, uint16_t* out, float* mean, float* rstd, const float* inp,
                          const float* w, const float* b, int N, int C);
void residual_layernorm_forward_lp(DType dt, float* res, uint16_t* out, float* mean, float* rstd,
                                   const float* a, const float* b, const float* w,
                                   const float* bias, int N, int C);
void rmsnorm_forward_lp(DType dt, uint16_t* out, float* rstd, const float* inp, const float* w,
                        int N, int C, float eps);
void residual_rmsnorm_forward_lp(DType dt, float* res, uint16_t* out, float* rstd, const float* a,
                                 const float* b, const float* w, int N, int C, float eps);

// elementwise.cpp
void gelu_forward(float* out, const float* inp, size_t n);
// set: the input gradient is written (the Ops' written gradients: 0 + g, as += on zeros), not
// accumulated.
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, bool set = false);
void swiglu_forward(float* out, const float* gu, int N, int F);
// narrow(dt, swiglu_forward / gelu_forward) in one pass (the Ops' 16-bit outputs).
void swiglu_forward_lp(DType dt, uint16_t* out, const float* gu, int N, int F);
// The same from gu held in dt (its values widened as they are read).
void swiglu_forward_lp(DType dt, uint16_t* out, const uint16_t* gu, int N, int F);
void gelu_forward_lp(DType dt, uint16_t* out, const float* inp, size_t n);
// The same from inp held in dt (its values widened as they are read).
void gelu_forward_lp(DType dt, uint16_t* out, const uint16_t* inp, size_t n);
// gelu_backward(set = true) with inp and dout each fp32 (the float pointer) or held in dt (the
// 16-bit one; the other null), widened as they are read.
void gelu_backward_set(DType dt, float* dinp, const float* inp, const uint16_t* inp16,
                       const float* dout, const uint16_t* dout16, size_t n);
// narrow(dt, gelu_backward_set) in one pass (Ops::gelu_backward's 16-bit dinp alone).
void gelu_backward_lp_set(DType dt, uint16_t* dinp, const float* inp, const uint16_t* inp16,
                          const float* dout, const uint16_t* dout16, size_t n);
void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F,
                     bool set = false);
// narrow(dt, swiglu_backward(set = true)) in one pass (Ops::swiglu_backward's 16-bit dgu), dout and
// gu each fp32 or held in dt (as gelu_backward_set).
void swiglu_backward_lp_set(DType dt, uint16_t* dgu, const float* dout, const uint16_t* dout16,
                            const float* gu, const uint16_t* gu16, int N, int F);
void residual_forward(float* out, const float* a, const float* b, size_t n);
double sum_squares(const float* x, size_t n);
// sum_squares of x's values rounded to bf16 as they are read (round_to's values: the same bits
// as sum_squares after round_to(BF16, x) in place).
double sum_squares_bf16(const float* x, size_t n);
void scale(float* x, float a, size_t n);
void fill(float* x, float v, size_t n);
void add_inplace(float* y, const float* x, size_t n);
void copy(float* dst, const float* src, size_t n);
void narrow(DType dt, const float* src, void* dst, size_t n);
void widen(DType dt, const void* src, float* dst, size_t n);
void add_widened(DType dt, const void* src, float* dst, size_t n);
void round_to(DType dt, float* x, size_t n);
void round_copy(DType dt, float* dst, const float* src, size_t n);  // dst = round_to(src)
// round_copy that also writes dst16 = narrow(src) (dt BF16 / F16; dst may equal src).
void round_copy_lp(DType dt, float* dst, uint16_t* dst16, const float* src, size_t n);

// rope.cpp
// Floats of the calling thread's (cos, sin) table for positions 0..T-1 at head dim hd.
size_t rope_table_floats(int T, int hd);
void rope_forward(float* qkv, int B, int T, int H, int KVH, int hd, const RopeSpec& rope);
void rope_backward(float* dqkv, int B, int T, int H, int KVH, int hd, const RopeSpec& rope);
// narrow(dt, rope_forward / rope_backward of a copy of the input) into the 16-bit output
// (Ops::rope_forward / rope_backward with a 16-bit out).
void rope_forward_lp(DType dt, uint16_t* qkv16, const float* qkv, int B, int T, int H, int KVH,
                     int hd, const RopeSpec& rope);
// The same from qkv held in dt (widened as read); src may be qkv16 itself (in place).
void rope_forward_lp(DType dt, uint16_t* qkv16, const uint16_t* src, int B, int T, int H, int KVH,
                     int hd, const RopeSpec& rope);
void rope_backward_lp(DType dt, uint16_t* dqkv16, const float* dqkv, int B, int T, int H, int KVH,
                      int hd, const RopeSpec& rope);
// The same from dqkv held in dt (widened as read); src may be dqkv16 itself (in place).
void rope_backward_lp(DType dt, uint16_t* dqkv16, const uint16_t* src, int B, int T, int H,
                      int KVH, int hd, const RopeSpec& rope);

// attention.cpp
// compute = BF16 / F16: the tile products (Q K^T, P V, and in the backward dO V^T, P^T dO,
// dS^T Q, dS K) take operands rounded to bf16 / fp16 and accumulate in fp32; softmax, lse and
// the running statistics stay fp32.
// qkv16 / out16 / dout16 (compute's 16-bit values; BF16 / F16 only), where non-null, replace
// qkv / out / dout: widened where the fp32 ones would be rounded (the Ops' attention with 16-bit
// operands).
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H, int KVH,
                       int hd, DType compute = DType::F32, const uint16_t* qkv16 = nullptr);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int H, int KVH, int hd,
                        DType compute = DType::F32, bool set = false,
                        const uint16_t* qkv16 = nullptr, const uint16_t* out16 = nullptr,
                        const uint16_t* dout16 = nullptr);
// Floats of the tile scratch each thread of the forward's and the backward's parallel
// regions keeps (one thread-local buffer, grown to the larger of the two).
size_t attention_tile_floats(int T, int hd);

// lmhead.cpp
// compute = BF16 / F16: the three products (logits, dx, dw) use gemm_lowp; the softmax and
// the loss stay fp32. On the oneDNN path (lowp_onednn) the operands go to it in bf16: w16 (the
// weight's bf16 form, exactly w's values, where the caller has one) or w narrowed once per
// call, x narrowed once, dlogits narrowed in the row pass; the same bits as gemm_lowp's.
// (w16: w's bf16 form where the caller has one; on the oneDNN bf16 path, lowp_onednn, w may
// then be null: only w16 is read.)
double lmhead_xent(float* loss, float* dx, float* dw, const float* x, const float* w,
                   const int32_t* targets, int N, int C, int V, float grad_scale,
                   DType compute = DType::F32, const uint16_t* w16 = nullptr);
// Rows per chunk of N rows at vocabulary V (the logits chunk is that many rows of V floats).
int lmhead_chunk_rows(int N, int V);

// gemm_onednn.cpp: a product a step hands the bf16 products with both operands in bf16
// (detail::gemm_bf16_16; its own kernels' candidates), for own16_pack_bytes.
struct Own16Call {
  bool ta = false, tb = false;
  int M = 0, N = 0, K = 0;
  bool c16 = false;  // a bf16 output
  int scope = 0;     // the ReusePackedB scope it runs in (0: none; one scope's calls adjacent;
                     // its calls with the same tb, N and K multiply one matrix)
};
// The bytes the own bf16 kernels' packing buffers hold after `calls` ran in order on one
// calling thread with `threads` OpenMP threads, as gemm_bf16_16 dispatches them in this
// process: the buffers are grow-only and kept per thread, tracked as Mem::Workspace (the
// transposed kernel's packed B and every team thread's A block; the other kernel's per-call
// packed B and its two ReusePackedB slots). 0 where own16_kernels() is false.
int64_t own16_pack_bytes(const std::vector<Own16Call>& calls, int threads);
// gemm_bf16.cpp: the bytes the native and fused kernels' packing buffers (gemm_bf16_avx512.cpp)
// hold after `calls` (products on fp32 operands, ta, tb, M, N, K; c16 and scope not read) ran on
// one calling thread with `threads` OpenMP threads, every one of them on that path (gemm_lowp's
// LowpPath::Native or Fused; with per-shape choice each shape's first call times it there):
// grow-only per team thread, tracked as Mem::Workspace, a packed A block and a packed B block
// the size of the thread's slab of columns.
int64_t lowp_pack_bytes(const std::vector<Own16Call>& calls, int threads);

// adamw.cpp
void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
           float beta2, float eps, float wd, int step, float grad_mult);
// adamw, then param16 = narrow(dt, param) (dt BF16 or F16), in one pass; grad_dt BF16: the
// gradients read rounded to bf16 (the same bits as round_to(BF16, grad) first; F32: as they are).
void adamw16(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
             float beta2, float eps, float wd, int step, float grad_mult, DType dt,
             uint16_t* param16, DType grad_dt = DType::F32);

// optimizers.cpp (Ops::sgd, lamb_prepare, add_scaled)
void sgd(float* param, const float* grad, float* m, size_t n, float lr, float momentum,
         float dampening, bool nesterov, float wd, float scale, int step, float grad_mult);
void lamb_prepare(const float* param, float* grad, float* m, float* v, size_t n, float beta1,
                  float beta2, float eps, float wd, float grad_mult);
void add_scaled(float* y, float a, const float* x, size_t n);

}  // namespace sw::cpu
