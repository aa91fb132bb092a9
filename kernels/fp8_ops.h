// FP8 linears (issue 39, point 3), in the style of torchtitan's float8 "tensorwise" recipe and
// Transformer Engine: an Ops decorator over a backend's bf16 Ops. Every op is forwarded to the
// wrapped Ops but the two Linear ones:
//
//   forward   y = x W^T: x and W quantised to E4M3, fp32 accumulation, bias added in fp32; the
//             output fp32 or the compute dtype's 16-bit as the Out form asks (kernels/ops.h);
//   backward  dout quantised to E5M2; dinp = dout W (E5M2 x E4M3), dW = dout^T x (E5M2 x E4M3);
//             db from dout's unquantised values (the wrapped Ops' own column sums).
//
// Scaling is per tensor. "current" (the default): scale = fp8_max / amax over the whole tensor
// as the op sees it (amax 0 or not finite: scale 1; amax below 1e-12 counts as 1e-12, as
// torchao's amax_to_scale clamps it). "delayed": the scale comes from the largest amax of the
// last `amax_history` calls of the same call site (the current amax is recorded after the scale
// is taken; a site's first call uses its current amax; every forward call records, so a
// recomputed forward or a micro-step counts as a call). A call site is keyed by the weight's
// pointer and the shape (C, OC): a unit whose gathered buffers are freed and gathered again
// (FULL_SHARD) may hand a buffer to another unit of the same shape, which then shares the
// history. That is a heuristic of the delayed recipe, never a correctness issue: values beyond
// fp8_max saturate.
//
// Quantisation: x * scale in fp32, rounded to the format by round to nearest even, saturating to
// +-fp8_max (inf included; torch's x.clamp(-max, max).to(torch.float8_*)), subnormals of the
// format kept, NaN kept (it propagates through the product as in bf16). round_fp8 below is the
// host definition both backends follow.
//
// Backends supply the primitives as Fp8Kernels (registered per device kind; the CPU's is built
// in): the CPU twin stores each quantised value as the bf16 holding it (every E4M3 / E5M2 value
// is a bf16 value) and multiplies with the oneDNN bf16 GEMM: products of fp8 values are exact in
// fp32, so it emulates an fp8 GEMM with fp32 accumulation up to the summation order. CUDA
// (kernels/cuda/fp8.cu): one byte a value and cuBLASLt's fp8 matmul. The quantised copies are
// backend scratch (Mem::Workspace) that the workspace declarations count (StepShape::fp8;
// kernels/cpu/workspace.cpp exact against the tracked peak, kernels/cuda/workspace.cpp read
// from fp8.cu, unchecked on a GPU).
//
// The LM head (lmhead_xent), attention and the norms stay in the wrapped Ops' bf16 / fp32. The
// inference path's last-position logits, which the models compute with linear_forward, go fp8:
// this decorator cannot tell that call from a block's product (a B-row product sampling reads).
// fp8.all_gather (sharding/unit_state.h): sharded units gather their Linear weights as E4M3
// bytes with power-of-two per-tensor scales (the recipe's pow2, which makes the quantisation
// here reproduce those bytes exactly); this decorator still quantises every weight it is given.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/forwarding_ops.h"
#include "kernels/ops.h"

namespace sw {

enum class Fp8Format : uint8_t { E4M3, E5M2 };  ///< torch.float8_e4m3fn, torch.float8_e5m2

/// The largest finite value of the format: 448 (E4M3), 57344 (E5M2).
constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.f : 57344.f; }

/// v rounded to the format (round to nearest even; beyond +-fp8_max, infinities included:
/// +-fp8_max; NaN: NaN), as a float (exact).
float round_fp8(float v, Fp8Format f);

/// The per-tensor scale of a tensor whose largest magnitude is amax: fp8_max / max(amax, 1e-12)
/// in fp32; 1 where amax is 0, negative, NaN or infinite. pow2 (torchao's
/// round_scales_to_power_of_2): that quotient rounded down to a power of two, so that x * scale
/// and q / scale are exact (the format's relative precision is the same; amax * scale then lies
/// in (fp8_max / 2, fp8_max]).
inline float fp8_scale(float amax, Fp8Format f, bool pow2 = false) {
  if (!(amax > 0.f) || !std::isfinite(amax)) return 1.f;
  const float s = fp8_max(f) / (amax < 1e-12f ? 1e-12f : amax);
  if (!pow2) return s;
  int e = 0;
  std::frexp(s, &e);  // s = m 2^e, m in [0.5, 1)
  return std::ldexp(1.f, e - 1);
}

/// The E4M3 byte (torch.float8_e4m3fn's bits: sign, 4 exponent bits biased 7, 3 mantissa
/// bits; 0x7F / 0xFF NaN) of round_fp8(v, E4M3): the same rounding and saturation.
uint8_t fp8_e4m3_bits(float v);
/// The value of an E4M3 byte (exact in fp32; 0x7F and 0xFF: NaN).
float fp8_e4m3_value(uint8_t b);
/// q[i] = fp8_e4m3_bits(bf16(x[i]) * scale) for n values, scale a power of two (fp8_scale's
/// pow2; sw::Error otherwise), in one branch-free loop.
void fp8_e4m3_encode_bf16(const float* x, int64_t n, float scale, uint8_t* q);

/// The fp8 block of the config (engine/config_schema.cpp "fp8").
struct Fp8Recipe {
  bool delayed = false;   ///< "delayed" (else "current")
  int amax_history = 16;  ///< delayed: amaxes kept per tensor of a call site
  bool pow2 = false;      ///< scales rounded down to powers of two (fp8_scale's pow2)
};

/// A backend's fp8 primitives. Every pointer is in the backend's memory (host for the CPU, the
/// device for CUDA) and every call runs on the backend's stream (no host synchronisation):
/// scales live in that memory as float pairs s = {scale, 1 / scale}.
class Fp8Kernels {
 public:
  virtual ~Fp8Kernels() = default;
  /// Bytes of one quantised value (the CPU twin: 2, the bf16 holding it; CUDA: 1).
  virtual size_t elem_bytes() const = 0;
  /// *amax = max |x| over n values (x's fp32 form where it has one, else its widened bf16
  /// values); NaNs are skipped.
  virtual void amax(float* amax, Operand x, size_t n) const = 0;
  /// s[0] = fp8_scale(max(amaxes[0..count)), f, pow2), s[1] = 1 / s[0].
  virtual void scales(float* s, const float* amaxes, int count, Fp8Format f,
                      bool pow2) const = 0;
  /// q = round_fp8(x * s[0], f) of the (rows, cols) row-major x, written (rows, cols), or with
  /// `transpose` (cols, rows).
  virtual void quantize(void* q, Fp8Format f, const float* s, Operand x, int rows, int cols,
                        bool transpose) const = 0;
  /// D(M, N) = (sa[1] * sb[1]) * A(M, K) B(N, K)^T + bias(N) + beta * Cin(M, N): A and B
  /// quantised (both K-major, row stride K), fp32 accumulation; bias, Cin may be null (Cin may
  /// be D's fp32 form: D += ...); D fp32 (row stride N) or bf16 (narrowed once).
  virtual void gemm(int M, int N, int K, const void* A, Fp8Format fa, const float* sa,
                    const void* B, Fp8Format fb, const float* sb, const float* bias,
                    const float* Cin, float beta, Out D) const = 0;
  /// At least `bytes` of grow-only scratch in slot (< kSlots); contents undefined.
  static constexpr int kSlots = 6;
  virtual void* scratch(int slot, size_t bytes) const = 0;
  /// n floats of the backend's memory, owned by the caller's object (amax histories); zeroed.
  virtual std::shared_ptr<float> alloc_floats(size_t n) const = 0;
  /// Whether gemm takes these sizes (cuBLASLt's fp8 matmul: multiples of 16); where not, the
  /// decorator runs the wrapped Ops' bf16 product for that call.
  virtual bool takes(int M, int N, int K) const {
    (void)M, (void)N, (void)K;
    return true;
  }
};

/// The CPU twin (kernels/cpu/fp8.cpp).
const Fp8Kernels& cpu_fp8_kernels();
/// Backends other than the CPU register theirs (kernels/cuda/fp8.cu); null where none did.
void register_fp8_kernels(DeviceKind kind, const Fp8Kernels* k);
const Fp8Kernels* fp8_kernels(DeviceKind kind);

/// The decorator. `inner` must compute in BF16 (sw::Error otherwise) and outlive it.
class Fp8Ops final : public ForwardingOps {
 public:
  Fp8Ops(const Ops& inner, const Fp8Recipe& recipe);
  const Fp8Recipe& recipe() const { return recipe_; }

  void linear_forward(Out out, Operand inp, Operand w, const float* b, const float* res, int N,
                      int C, int OC) const override;
  void linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp, Operand w,
                       int N, int C, int OC) const override;

  // Everything else: the wrapped Ops (ForwardingOps).

 private:
  // Delayed scaling: the amax histories of a call site (x, w, dout), in the backend's memory.
  struct Site {
    std::shared_ptr<float> hist[3];
    int pos[3] = {0, 0, 0};
    bool started[3] = {false, false, false};
  };
  // The scale pair of tensor `role` (0 x, 1 w, 2 dout) of the call site (w, C, OC) into s, the
  // amax at s[2]: current: its amax now; delayed: from the site's history (record: this call's
  // amax is recorded after: the forward's x and w and the backward's dout; the backward's x and
  // w reuse the histories as they stand).
  void scale_of(float* s, int role, Fp8Format f, Operand x, size_t n, const void* wkey, int C,
                int OC, bool record) const;

  const Fp8Kernels& k_;
  Fp8Recipe recipe_;
  mutable std::mutex mu_;
  mutable std::map<std::tuple<const void*, int, int>, Site> sites_;
};

/// An Fp8Ops over `inner` (shared: the ShardedModel keeps it with its context).
std::shared_ptr<const Ops> make_fp8_ops(const Ops& inner, const Fp8Recipe& recipe);

}  // namespace sw
