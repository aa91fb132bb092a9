// The FP8 Ops decorator (kernels/fp8_ops.h): scaling, quantisation and the three products of a
// Linear through a backend's Fp8Kernels; every other op goes to the wrapped bf16 Ops.
#include "kernels/fp8_ops.h"

#include <bit>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace sw {

float round_fp8(float v, Fp8Format f) {
  if (std::isnan(v)) return v;
  const float mx = fp8_max(f);
  const float a = std::fabs(v);
  if (a >= mx) return std::copysign(mx, v);  // saturation (infinities included)
  // E4M3: 3 mantissa bits, smallest normal 2^-6; E5M2: 2 bits, 2^-14.
  const int mbits = f == Fp8Format::E4M3 ? 3 : 2;
  const int emin = f == Fp8Format::E4M3 ? -6 : -14;
  float r;
  if (a >= std::ldexp(1.f, emin)) {
    // Normal: keep mbits of fp32's 23-bit mantissa, round to nearest even on the bits.
    const int shift = 23 - mbits;
    uint32_t u = std::bit_cast<uint32_t>(a);
    u += ((1u << (shift - 1)) - 1) + ((u >> shift) & 1u);
    u &= ~((1u << shift) - 1);
    r = std::bit_cast<float>(u);
  } else {
    // Subnormal of the format: multiples of 2^(emin - mbits), rounded to nearest even by fp32's
    // own addition against a constant whose unit in the last place is that quantum.
    const float big = std::ldexp(1.f, emin - mbits + 23);
    volatile float t = a + big;  // (volatile: the sum must be rounded, not folded away)
    r = t - big;
  }
  return std::copysign(r, v);
}

namespace {
// The E4M3 byte of round_fp8(v, E4M3), without branches (so that a loop of it vectorises): the
// normal range rounded to 3 mantissa bits (nearest even), the subnormals as multiples of 2^-9
// counted in units in the last place of 16384 + |v| (2^-9: fp32's addition rounds to nearest
// even), 8 of them the smallest normal (byte 0x08); >= 448 and inf saturated, NaN 0x7f.
inline uint8_t e4m3_byte(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  const uint32_t normal = (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u);  // e - 127 + 7, m
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 16384.f) - 0x46800000u;
  uint32_t b = a >= 0x3c800000u ? normal : sub;  // >= 2^-6: normal
  b = a >= 0x43e00000u ? 0x7eu : b;
  b = a > 0x7f800000u ? 0x7fu : b;
  return static_cast<uint8_t>(sign | b);
}
}  // namespace

uint8_t fp8_e4m3_bits(float v) { return e4m3_byte(v); }

float fp8_e4m3_value(uint8_t b) {
  const float sign = (b & 0x80) ? -1.f : 1.f;
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(float(m), -9);
  return sign * std::ldexp(float(8 + m), e - 7 - 3);
}

void fp8_e4m3_encode_bf16(const float* x, int64_t n, float scale, uint8_t* q) {
  int k = 0;
  if (!(scale > 0.f) || std::frexp(scale, &k) != 0.5f)
    fail("kernels", "fp8 encode: the scale " + std::to_string(scale) + " is not a power of two");
  // bf16(x) * scale is exact (a power of two; an fp32 underflow or overflow lands on 0 or
  // saturation alike); the bf16 rounding keeps a NaN one.
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t ux = std::bit_cast<uint32_t>(x[i]);
    const uint32_t bx = (ux & 0x7fffffffu) > 0x7f800000u
                            ? (ux | 0x400000u) & 0xffff0000u
                            : (ux + 0x7fffu + ((ux >> 16) & 1u)) & 0xffff0000u;
    q[i] = e4m3_byte(std::bit_cast<float>(bx) * scale);
  }
}

namespace {
const Fp8Kernels* g_fp8[static_cast<size_t>(DeviceKind::Count)] = {};
}  // namespace

void register_fp8_kernels(DeviceKind kind, const Fp8Kernels* k) {
  SW_CHECK(kind != DeviceKind::CPU && kind != DeviceKind::Count,
           "the CPU fp8 kernels are built in");
  g_fp8[static_cast<size_t>(kind)] = k;
}

const Fp8Kernels* fp8_kernels(DeviceKind kind) {
  if (kind == DeviceKind::CPU) return &cpu_fp8_kernels();
  SW_CHECK(kind != DeviceKind::Count, "fp8_kernels: no such device kind");
  return g_fp8[static_cast<size_t>(kind)];
}

namespace {
const Fp8Kernels& kernels_of(const Ops& inner) {
  if (inner.compute() != DType::BF16)
    fail("kernels", std::string("fp8: the linears wrap bf16 Ops, not ") +
                        dtype_name(inner.compute()) + " (fp8 needs bf16 mixed precision)");
  const Fp8Kernels* k = fp8_kernels(inner.device().kind);
  if (!k)
    fail("kernels", "fp8: no fp8 kernels for device " + inner.device().str() + " in this build");
  return *k;
}
}  // namespace

Fp8Ops::Fp8Ops(const Ops& inner, const Fp8Recipe& recipe)
    : ForwardingOps(inner), k_(kernels_of(inner)), recipe_(recipe) {
  SW_CHECK(!recipe_.delayed || recipe_.amax_history >= 1, "fp8: amax_history must be >= 1");
}

std::shared_ptr<const Ops> make_fp8_ops(const Ops& inner, const Fp8Recipe& recipe) {
  return std::make_shared<const Fp8Ops>(inner, recipe);
}

void Fp8Ops::scale_of(float* s, int role, Fp8Format f, Operand x, size_t n, const void* wkey, int C,
                      int OC, bool record) const {
  if (!recipe_.delayed) {
    float* am = s + 2;  // (the caller's pair is followed by a free float: the amax)
    k_.amax(am, x, n);
    k_.scales(s, am, 1, f, recipe_.pow2);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  Site& site = sites_[{wkey, C, OC}];
  const int h = recipe_.amax_history;
  if (!site.hist[role]) site.hist[role] = k_.alloc_floats(static_cast<size_t>(h));
  float* hist = site.hist[role].get();
  if (!site.started[role]) {
    // The first call: its own amax (the zeroed history's other entries do not raise the max).
    k_.amax(hist, x, n);
    site.started[role] = true;
    site.pos[role] = 1 % h;
    k_.scales(s, hist, h, f, recipe_.pow2);
    return;
  }
  k_.scales(s, hist, h, f, recipe_.pow2);  // the previous calls' amaxes
  if (record) {
    k_.amax(hist + site.pos[role], x, n);
    site.pos[role] = (site.pos[role] + 1) % h;
  }
}

void Fp8Ops::linear_forward(Out out, Operand inp, Operand w, const float* b, const float* res,
                            int N, int C, int OC) const {
  if (res && !out.f32) refuse("linear_forward", "res with a 16-bit out");
  if (N <= 0 || OC <= 0 || C <= 0 || !k_.takes(N, OC, C))
    return in_.linear_forward(out, inp, w, b, res, N, C, OC);
  const size_t eb = k_.elem_bytes();
  float* s = static_cast<float*>(k_.scratch(5, 8 * sizeof(float)));  // {sx, 1/sx, amax, -, sw, ...}
  void* xq = k_.scratch(0, eb * size_t(N) * C);
  void* wq = k_.scratch(1, eb * size_t(OC) * C);
  const void* wkey = w.f32 ? static_cast<const void*>(w.f32) : w.lp;
  scale_of(s, 0, Fp8Format::E4M3, inp, size_t(N) * C, wkey, C, OC, true);
  scale_of(s + 4, 1, Fp8Format::E4M3, w, size_t(OC) * C, wkey, C, OC, true);
  k_.quantize(xq, Fp8Format::E4M3, s, inp, N, C, false);
  k_.quantize(wq, Fp8Format::E4M3, s + 4, w, OC, C, false);
  k_.gemm(N, OC, C, xq, Fp8Format::E4M3, s, wq, Fp8Format::E4M3, s + 4, b, res, res ? 1.f : 0.f,
          out);
}

void Fp8Ops::linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp,
                             Operand w, int N, int C, int OC) const {
  if (N <= 0 || OC <= 0 || C <= 0 || (dinp && !k_.takes(N, C, OC)) || (dw && !k_.takes(OC, C, N)))
    return in_.linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  // db: a sum, not a product: the wrapped Ops' column sums of dout's unquantised values.
  if (db) in_.linear_backward(nullptr, nullptr, db, dout, inp, w, N, C, OC);
  if (!dinp && !dw) return;
  const size_t eb = k_.elem_bytes();
  const void* wkey = w.f32 ? static_cast<const void*>(w.f32) : w.lp;
  float* s = static_cast<float*>(k_.scratch(5, 12 * sizeof(float)));  // {sd | sw | sx} pairs + amax
  scale_of(s, 2, Fp8Format::E5M2, dout, size_t(N) * OC, wkey, C, OC, true);
  // A product's operands in scratch slots (slot, slot + 1): dout in E5M2 (transposed or not)
  // and t (rows x cols, tensor `role` of the site, its scale at st) in E4M3, transposed.
  auto operands = [&](int slot, bool dout_t, int role, Operand t, int rows, int cols, float* st) {
    void* dq = k_.scratch(slot, eb * size_t(N) * OC);
    void* tq = k_.scratch(slot + 1, eb * size_t(rows) * cols);
    scale_of(st, role, Fp8Format::E4M3, t, size_t(rows) * cols, wkey, C, OC, false);
    k_.quantize(dq, Fp8Format::E5M2, s, dout, N, OC, dout_t);
    k_.quantize(tq, Fp8Format::E4M3, st, t, rows, cols, true);
    return std::pair<void*, void*>{dq, tq};
  };
  if (dinp) {
    // dinp(N, C) = dout(N, OC) W(OC, C): K = OC, so W goes K-major as W^T (C, OC).
    const auto [dq, wqt] = operands(0, false, 1, w, OC, C, s + 4);
    if (dinp.f32) {
      k_.gemm(N, C, OC, dq, Fp8Format::E5M2, s, wqt, Fp8Format::E4M3, s + 4, nullptr,
              dinp.write ? nullptr : dinp.f32, dinp.write ? 0.f : 1.f, Out(dinp.f32));
      if (dinp.lp) in_.narrow(in_.compute(), dinp.f32, dinp.lp, size_t(N) * C);
    } else {
      k_.gemm(N, C, OC, dq, Fp8Format::E5M2, s, wqt, Fp8Format::E4M3, s + 4, nullptr, nullptr, 0.f,
              Out(dinp.lp));
    }
  }
  if (dw) {
    // dW(OC, C) = dout^T(OC, N) x(N, C): K = N, both transposed to K-major.
    const auto [dqt, xqt] = operands(2, true, 0, inp, N, C, s + 8);
    k_.gemm(OC, C, N, dqt, Fp8Format::E5M2, s, xqt, Fp8Format::E4M3, s + 8, nullptr,
            dw.write ? nullptr : dw.p, dw.beta(), Out(dw.p));
  }
}

}  // namespace sw
