// Rotary position embedding, Hugging Face "rotate_half" convention: within a head of hd dims,
// dim i pairs with dim i + hd/2 (i < hd/2) and the pair is rotated by angle t * inv_freq[i],
// inv_freq[i] = rope_inv_freq(spec, i, hd) (kernels/ops.h: theta^(-2i/hd), llama3-scaled where
// the spec says):
//   y[i]        = x[i] cos - x[i+hd/2] sin
//   y[i + hd/2] = x[i+hd/2] cos + x[i] sin
// Backward applies the transpose (= inverse) rotation to the gradient, in place.
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

namespace sw::cpu {

namespace {

constexpr size_t kParallelMin = size_t{1} << 14;  // elements

// cos/sin table (T, hd/2), computed the way transformers' LlamaRotaryEmbedding does in fp32:
// inv_freq = rope_inv_freq (ops.h) rounded to float, angle = float(t) * inv_freq in float;
// cos/sin are then evaluated in double and rounded once. Cached per calling thread and only
// recomputed when hd or the spec change or a longer T is asked for (rows of a longer table are
// the same, so a prefix serves any shorter T).
struct RopeTable {
  int T = 0, hd = 0;
  RopeSpec spec{0.f};
  Buffer mem;  // cos (T, hd/2) then sin (T, hd/2), tracked as Mem::Workspace
  const float* cos() const { return mem.f32(); }
  const float* sin() const { return mem.f32() + static_cast<size_t>(T) * (hd / 2); }
};

const RopeTable& rope_table(int T, int hd, const RopeSpec& spec) {
  thread_local RopeTable tab;
  if (tab.hd == hd && tab.spec.same(spec) && tab.T >= T) return tab;
  const int half = hd / 2;
  tab.T = T;
  tab.hd = hd;
  tab.spec = spec;
  float* cos_tab = detail::grow_workspace(tab.mem, rope_table_floats(T, hd));
  float* sin_tab = cos_tab + static_cast<size_t>(T) * half;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(spec, i, hd);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv_freq[i];
      cos_tab[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(double{angle}));
      sin_tab[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(double{angle}));
    }
  return tab;
}

inline float out_of(float v, DType) { return v; }
inline uint16_t out_of16(float v, DType dt) {
  return dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}

// An input element as fp32: the float, or a 16-bit value of dt widened.
inline float in_of(float v, DType) { return v; }
inline float in_of(uint16_t v, DType dt) {
  return dt == DType::BF16 ? bf16_to_f32(v) : f16_to_f32(v);
}

// Rotates the q and k heads of every (b, t) row of `in` by +angle (sign = 1) or -angle
// (sign = -1) into `out` (T = float: out == in, in place; T = uint16_t: narrowed to dt, the v
// heads narrowed as they are, out of place from fp32, or from 16-bit In (dt), where out may
// be in: each element is read before the same element is written).
template <class T, class In = float>
void rope_apply(T* out, const In* in, int B, int Tn, int H, int KVH, int hd, const RopeSpec& spec,
                float sign, DType dt) {
  SW_CHECK(hd % 2 == 0, "rope: head dim must be even");
  const RopeTable& tab = rope_table(Tn, hd, spec);
  const int half = hd / 2;
  const int rot_heads = H + KVH;  // q heads then k heads; v heads follow
  const size_t row = static_cast<size_t>(H + 2 * KVH) * hd;
  const int BT = B * Tn;
  const float* cos_tab = tab.cos();
  const float* sin_tab = tab.sin();
  auto put = [dt](float v) {
    if constexpr (std::is_same_v<T, float>)
      return out_of(v, dt);
    else
      return out_of16(v, dt);
  };
#pragma omp parallel for schedule(static) \
    if (parallel : static_cast<size_t>(BT) * rot_heads * hd >= kParallelMin)
  for (int n = 0; n < BT; ++n) {
    const int t = n % Tn;
    const float* c = cos_tab + static_cast<size_t>(t) * half;
    const float* s = sin_tab + static_cast<size_t>(t) * half;
    const In* base = in + n * row;
    T* obase = out + n * row;
    for (int h = 0; h < rot_heads; ++h) {
      const In* x1 = base + static_cast<size_t>(h) * hd;
      const In* x2 = x1 + half;
      T* y1 = obase + static_cast<size_t>(h) * hd;
      T* y2 = y1 + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float a = in_of(x1[i], dt), b = in_of(x2[i], dt), sn = sign * s[i];
        y1[i] = put(a * c[i] - b * sn);
        y2[i] = put(b * c[i] + a * sn);
      }
    }
    if constexpr (!std::is_same_v<T, float>) {
      const size_t v0 = static_cast<size_t>(rot_heads) * hd;
#pragma omp simd
      for (size_t i = v0; i < row; ++i) obase[i] = put(in_of(base[i], dt));
    }
  }
}

}  // namespace

size_t rope_table_floats(int T, int hd) {  // (the table's grow_workspace above)
  return 2 * static_cast<size_t>(T > 0 ? T : 0) * static_cast<size_t>(hd > 0 ? hd / 2 : 0);
}

void rope_forward(float* qkv, int B, int T, int H, int KVH, int hd, const RopeSpec& spec) {
  rope_apply(qkv, qkv, B, T, H, KVH, hd, spec, 1.f, DType::F32);
}

void rope_backward(float* dqkv, int B, int T, int H, int KVH, int hd, const RopeSpec& spec) {
  rope_apply(dqkv, dqkv, B, T, H, KVH, hd, spec, -1.f, DType::F32);
}

void rope_forward_lp(DType dt, uint16_t* qkv16, const float* qkv, int B, int T, int H, int KVH,
                     int hd, const RopeSpec& spec) {
  rope_apply(qkv16, qkv, B, T, H, KVH, hd, spec, 1.f, dt);
}

void rope_forward_lp(DType dt, uint16_t* qkv16, const uint16_t* src, int B, int T, int H, int KVH,
                     int hd, const RopeSpec& spec) {
  rope_apply(qkv16, src, B, T, H, KVH, hd, spec, 1.f, dt);
}

void rope_backward_lp(DType dt, uint16_t* dqkv16, const float* dqkv, int B, int T, int H, int KVH,
                      int hd, const RopeSpec& spec) {
  rope_apply(dqkv16, dqkv, B, T, H, KVH, hd, spec, -1.f, dt);
}

void rope_backward_lp(DType dt, uint16_t* dqkv16, const uint16_t* src, int B, int T, int H,
                      int KVH, int hd, const RopeSpec& spec) {
  rope_apply(dqkv16, src, B, T, H, KVH, hd, spec, -1.f, dt);
}

}  // namespace sw::cpu
