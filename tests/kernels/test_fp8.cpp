// FP8 linears (kernels/fp8_ops.h) on the CPU twin.
//
// (a) Rounding: round_fp8 against PyTorch's saturating casts to torch.float8_e4m3fn /
//     float8_e5m2 (tests/kernels/data/fp8_reference.txt, written by gen_fp8_reference.py):
//     bit for bit on ties, saturation, subnormals, signed zeros and random values; NaN stays
//     NaN. The CPU twin's quantize is round_fp8(x * scale), transposed or not.
// (b) The fp8 linear against a double reference on the quantised operands, scales computed
//     here from the definition (fp8_max / amax): products of fp8 values are exact, so the only
//     error left is fp32 accumulation, the proven bound (K + 2) u sum_k |a_k b_k| / (s_a s_b)
//     (u = 2^-24), plus one rounding of the scale product and the bias: 2 u |ref| (and half a
//     bf16 unit, 2^-8 |ref|, where the output is 16-bit). Every form of out / dinp / dw / db.
// (c) The fp8 linear against the bf16 one: relative rms difference within a stated fp8
//     tolerance (each quantised factor is within 2^-4 (E4M3) or 2^-3 (E5M2) of its value
//     relative, with random signs: rms of a few percent; asserted below 0.05 forward, 0.08
//     for the E5M2 x E4M3 gradients).
// (d) Delayed scaling: a site's later call takes its scale from the amax history, not from the
//     tensor it quantises.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/fp8_ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using sw::Fp8Format;
using swtest::kU;
using swtest::Vec;

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

Vec quant(const Vec& x, Fp8Format f, float* inv) {
  float am = 0;
  for (float v : x) am = std::max(am, std::fabs(v));
  const float s = sw::fp8_scale(am, f);
  *inv = 1.f / s;
  Vec q(x.size());
  for (size_t i = 0; i < x.size(); ++i) q[i] = sw::round_fp8(x[i] * s, f);
  return q;
}

// out(M, N) = inv * A(M, K) B(N, K)^T (+ bias) in double, and the error bound of each element.
void ref_tn(int M, int N, int K, const Vec& A, const Vec& B, float inv, const float* bias,
            std::vector<double>& out, std::vector<double>& bound) {
  out.assign(size_t(M) * N, 0), bound.assign(size_t(M) * N, 0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0, sa = 0;
      for (int k = 0; k < K; ++k) {
        const double p = double(A[size_t(i) * K + k]) * B[size_t(j) * K + k];
        s += p, sa += std::fabs(p);
      }
      const double r = s * inv + (bias ? bias[j] : 0.0);
      out[size_t(i) * N + j] = r;
      bound[size_t(i) * N + j] = (K + 2) * kU * sa * inv + 2 * kU * std::fabs(r) + 1e-30;
    }
}

Vec transpose(const Vec& x, int rows, int cols) {
  Vec t(x.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[size_t(c) * rows + r] = x[size_t(r) * cols + c];
  return t;
}

double worst_ratio(const float* got, const std::vector<double>& ref, const std::vector<double>& b,
                   double extra_rel = 0) {
  double w = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    w = std::max(w, std::fabs(got[i] - ref[i]) / (b[i] + extra_rel * std::fabs(ref[i])));
  return w;
}

double rel_rms(const Vec& a, const Vec& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

const sw::Ops& bf16() { return sw::ops_for(sw::Device::cpu(), sw::DType::BF16); }

}  // namespace

TEST_CASE("fp8: round_fp8 is PyTorch's saturating cast, bit for bit") {
  std::ifstream f(std::string(SW_SOURCE_DIR) + "/tests/kernels/data/fp8_reference.txt");
  REQUIRE(f);
  std::string line;
  int n = 0, nan = 0, inexact = 0;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    uint32_t xb, e4, e5;
    is >> std::hex >> xb >> e4 >> e5;
    const float x = from_bits(xb);
    for (auto [fmt, want] : {std::pair{Fp8Format::E4M3, e4}, std::pair{Fp8Format::E5M2, e5}}) {
      const float got = sw::round_fp8(x, fmt);
      if (std::isnan(from_bits(want))) {
        CHECK(std::isnan(got));
        ++nan;
      } else {
        INFO("x " << x << " (" << std::hex << xb << ") format " << int(fmt) << ": got "
                  << to_bits(got) << " want " << want);
        CHECK(to_bits(got) == want);
      }
    }
    // (inputs E4M3 cannot hold as they are: rounded)
    const float r = sw::round_fp8(x, Fp8Format::E4M3);
    if (std::isfinite(x) && r != x && std::fabs(x) < 448) ++inexact;
    ++n;
  }
  CHECK(n > 3000);
  // The CPU twin's vectorised quantize (scale 1) on the same inputs: the same values.
  f.clear();
  f.seekg(0);
  std::vector<float> xs;
  std::vector<uint32_t> w4, w5;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    uint32_t xb, e4, e5;
    is >> std::hex >> xb >> e4 >> e5;
    xs.push_back(from_bits(xb)), w4.push_back(e4), w5.push_back(e5);
  }
  const float one[2] = {1.f, 1.f};
  for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    std::vector<uint16_t> q(xs.size());
    sw::cpu_fp8_kernels().quantize(q.data(), fmt, one, xs.data(), 1, int(xs.size()), false);
    int bad = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const float want = from_bits(fmt == Fp8Format::E4M3 ? w4[i] : w5[i]);
      const float got = sw::bf16_to_f32(q[i]);
      bad += std::isnan(want) ? !std::isnan(got) : to_bits(got) != to_bits(want);
    }
    CHECK(bad == 0);
  }
  CHECK(nan == 4);  // +-NaN, both formats
  CHECK(inexact > 100);
  // The E4M3 byte form (the fp8 all-gather's wire): the byte of the rounded value, bit for bit
  // against PyTorch on the same inputs (value(bits(x)) == torch's cast; NaN stays NaN).
  int bad_bytes = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float want = from_bits(w4[i]), got = sw::fp8_e4m3_value(sw::fp8_e4m3_bits(xs[i]));
    bad_bytes += std::isnan(want) ? !std::isnan(got) : to_bits(got) != to_bits(want);
  }
  CHECK(bad_bytes == 0);
}

TEST_CASE("fp8: the E4M3 byte form is torch.float8_e4m3fn's, and power-of-two scales") {
  // Bytes every E4M3fn implementation agrees on: 1 = 0x38, 2 = 0x40, -1 = 0xB8, 448 = 0x7E,
  // the smallest normal 2^-6 = 0x08, the smallest subnormal 2^-9 = 0x01; NaN 0x7F.
  CHECK(sw::fp8_e4m3_bits(1.f) == 0x38);
  CHECK(sw::fp8_e4m3_bits(2.f) == 0x40);
  CHECK(sw::fp8_e4m3_bits(-1.f) == 0xB8);
  CHECK(sw::fp8_e4m3_bits(448.f) == 0x7E);
  CHECK(sw::fp8_e4m3_bits(1e9f) == 0x7E);
  CHECK(sw::fp8_e4m3_bits(-INFINITY) == 0xFE);
  CHECK(sw::fp8_e4m3_bits(std::ldexp(1.f, -6)) == 0x08);
  CHECK(sw::fp8_e4m3_bits(std::ldexp(1.f, -9)) == 0x01);
  CHECK((sw::fp8_e4m3_bits(NAN) & 0x7F) == 0x7F);
  // Every byte round-trips (NaN aside), and the bytes' values are the format's 253 finite
  // non-negative-or-negative values, each round_fp8's fixed point.
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) {
      CHECK(std::isnan(sw::fp8_e4m3_value(uint8_t(b))));
      continue;
    }
    const float v = sw::fp8_e4m3_value(uint8_t(b));
    INFO("byte " << b << " value " << v);
    CHECK(sw::fp8_e4m3_bits(v) == b);
    CHECK(sw::round_fp8(v, Fp8Format::E4M3) == v);
  }
  // A sweep of fp32 bit patterns (every 4099th): bits then value is round_fp8.
  int bad = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) {
    const float x = from_bits(uint32_t(u));
    const float got = sw::fp8_e4m3_value(sw::fp8_e4m3_bits(x)),
                want = sw::round_fp8(x, Fp8Format::E4M3);
    bad += std::isnan(want) ? !std::isnan(got) : to_bits(got) != to_bits(want);
  }
  CHECK(bad == 0);
  // The gather's encoder: the same bytes as the definition for power-of-two scales, on random
  // values of many magnitudes, specials and the fixture's inputs.
  std::vector<float> xs = swtest::randv(4096, 11, 1.f);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::ldexp(xs[i], int(i % 97) - 60);
  for (float v : {0.f, -0.f, INFINITY, -INFINITY, NAN, 1e-40f, -3e38f, 448.f, 464.f, 0.0019531f})
    xs.push_back(v);
  for (float sc : {1.f, 0.00390625f, 32.f, 1024.f, std::ldexp(1.f, 40), std::ldexp(1.f, -100)}) {
    std::vector<uint8_t> q(xs.size());
    sw::fp8_e4m3_encode_bf16(xs.data(), int64_t(xs.size()), sc, q.data());
    int wrong = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const uint8_t want = sw::fp8_e4m3_bits(sw::bf16_to_f32(sw::f32_to_bf16(xs[i])) * sc);
      wrong += std::isnan(xs[i]) ? (q[i] & 0x7F) != 0x7F : q[i] != want;
    }
    INFO("scale " << sc);
    CHECK(wrong == 0);
  }
  CHECK_THROWS(sw::fp8_e4m3_encode_bf16(xs.data(), 1, 3.f, nullptr));
  // pow2: the largest power of two not above fp8_max / amax.
  CHECK(sw::fp8_scale(2.f, Fp8Format::E4M3, true) == 128.f);  // 224 -> 128
  CHECK(sw::fp8_scale(1.75f, Fp8Format::E4M3, true) == 256.f);  // exactly 256
  CHECK(sw::fp8_scale(0.f, Fp8Format::E4M3, true) == 1.f);
  for (float am : {1e-3f, 0.37f, 3.f, 447.f, 1e5f}) {
    const float s = sw::fp8_scale(am, Fp8Format::E4M3, true);
    int e = 0;
    CHECK(std::frexp(s, &e) == 0.5f);
    CHECK(am * s <= 448.f);
    CHECK(am * s > 224.f);
  }
}

TEST_CASE("fp8: scale and the CPU twin's quantize") {
  CHECK(sw::fp8_scale(0.f, Fp8Format::E4M3) == 1.f);
  CHECK(sw::fp8_scale(INFINITY, Fp8Format::E5M2) == 1.f);
  CHECK(sw::fp8_scale(NAN, Fp8Format::E5M2) == 1.f);
  CHECK(sw::fp8_scale(2.f, Fp8Format::E4M3) == 224.f);
  CHECK(sw::fp8_scale(2.f, Fp8Format::E5M2) == 28672.f);
  const sw::Fp8Kernels& k = sw::cpu_fp8_kernels();
  const int R = 37, C = 53;
  Vec x = swtest::randv(size_t(R) * C, 7, 3.f);
  x[5] = -11.5f;
  std::vector<uint16_t> x16(x.size());
  for (size_t i = 0; i < x.size(); ++i) x16[i] = sw::f32_to_bf16(x[i]);
  for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (bool lp : {false, true})
      for (bool tr : {false, true}) {
        const sw::Operand op = lp ? sw::Operand(x16.data()) : sw::Operand(x.data());
        float s[4];
        k.amax(s + 2, op, x.size());
        float am = 0;
        for (size_t i = 0; i < x.size(); ++i)
          am = std::max(am, std::fabs(lp ? sw::bf16_to_f32(x16[i]) : x[i]));
        REQUIRE(s[2] == am);
        k.scales(s, s + 2, 1, fmt, false);
        REQUIRE(s[0] == sw::fp8_scale(am, fmt));
        float s2[2];
        k.scales(s2, s + 2, 1, fmt, true);
        REQUIRE(s2[0] == sw::fp8_scale(am, fmt, true));
        REQUIRE(s2[1] == 1.f / s2[0]);
        std::vector<uint16_t> q(x.size());
        k.quantize(q.data(), fmt, s, op, R, C, tr);
        int bad = 0;
        for (int r = 0; r < R; ++r)
          for (int c = 0; c < C; ++c) {
            const size_t i = size_t(r) * C + c;
            const float v = lp ? sw::bf16_to_f32(x16[i]) : x[i];
            const float want = sw::round_fp8(v * s[0], fmt);
            const float got = sw::bf16_to_f32(q[tr ? size_t(c) * R + r : i]);
            bad += to_bits(got) != to_bits(want);
          }
        CHECK(bad == 0);
      }
}

TEST_CASE("fp8: linear forward and backward against the double reference on quantised operands") {
  const sw::Fp8Ops ops(bf16(), {});
  for (auto [N, C, OC] :
       {std::tuple{64, 48, 80}, std::tuple{33, 70, 19}, std::tuple{128, 256, 96}}) {
    const Vec x = swtest::randv(size_t(N) * C, 1 + N, 1.f);
    const Vec w = swtest::randv(size_t(OC) * C, 2 + C, 0.05f);
    const Vec b = swtest::randv(size_t(OC), 3, 0.1f);
    const Vec dy = swtest::randv(size_t(N) * OC, 4 + OC, 1e-3f);
    float ix, iw, id;
    const Vec xq = quant(x, Fp8Format::E4M3, &ix), wq = quant(w, Fp8Format::E4M3, &iw),
              dq = quant(dy, Fp8Format::E5M2, &id);
    std::vector<double> ref, bound;
    INFO("N " << N << " C " << C << " OC " << OC);

    // forward: fp32 out, bf16 out, fp32 out with res
    ref_tn(N, OC, C, xq, wq, ix * iw, b.data(), ref, bound);
    Vec y(size_t(N) * OC, NAN);
    ops.linear_forward(y.data(), x.data(), w.data(), b.data(), nullptr, N, C, OC);
    double wr = worst_ratio(y.data(), ref, bound);
    REPORT("forward fp32: error / bound " << wr);
    CHECK(wr <= 1);
    std::vector<uint16_t> y16(y.size());
    ops.linear_forward(y16.data(), x.data(), w.data(), b.data(), nullptr, N, C, OC);
    Vec y16w(y.size());
    for (size_t i = 0; i < y.size(); ++i) y16w[i] = sw::bf16_to_f32(y16[i]);
    CHECK(worst_ratio(y16w.data(), ref, bound, 1.0 / 256) <= 1);
    const Vec res = swtest::randv(y.size(), 9, 1.f);
    Vec yr(y.size());
    ops.linear_forward(yr.data(), x.data(), w.data(), b.data(), res.data(), N, C, OC);
    for (size_t i = 0; i < y.size(); ++i) ref[i] += res[i], bound[i] += 2 * kU * std::fabs(ref[i]);
    CHECK(worst_ratio(yr.data(), ref, bound) <= 1);

    // backward: dinp = dq W (K = OC), dW = dq^T x (K = N), db = colsum(dy) exactly as the bf16 Ops
    ref_tn(N, C, OC, dq, transpose(wq, OC, C), id * iw, nullptr, ref, bound);
    std::vector<double> refw, boundw;
    ref_tn(OC, C, N, transpose(dq, N, OC), transpose(xq, N, C), id * ix, nullptr, refw, boundw);
    const Vec dx0 = swtest::randv(size_t(N) * C, 11, 1e-3f),
              dw0 = swtest::randv(w.size(), 12, 1e-3f);
    Vec dx = dx0, dw = dw0, db(OC, 0.5f), db_ref(OC, 0.5f), dummy(size_t(OC) * C, 0.f);
    ops.linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
    bf16().linear_backward(nullptr, nullptr, db_ref.data(), dy.data(), x.data(), w.data(), N, C,
                           OC);
    CHECK(swtest::same_bits(db, db_ref));
    std::vector<double> r1 = ref, b1 = bound, r2 = refw, b2 = boundw;
    for (size_t i = 0; i < r1.size(); ++i) r1[i] += dx0[i], b1[i] += 2 * kU * std::fabs(r1[i]);
    for (size_t i = 0; i < r2.size(); ++i) r2[i] += dw0[i], b2[i] += 2 * kU * std::fabs(r2[i]);
    wr = worst_ratio(dx.data(), r1, b1);
    const double wr2 = worst_ratio(dw.data(), r2, b2);
    REPORT("backward added: dinp error / bound " << wr << ", dw " << wr2);
    CHECK(wr <= 1);
    CHECK(wr2 <= 1);
    // written forms (garbage before), 16-bit dinp alone and both
    Vec dxw(dx.size(), NAN), dww(dw.size(), NAN);
    ops.linear_backward(sw::GradIn::set(dxw.data()), sw::GradOut(dww.data(), true), nullptr,
                        dy.data(), x.data(), w.data(), N, C, OC);
    CHECK(worst_ratio(dxw.data(), ref, bound) <= 1);
    CHECK(worst_ratio(dww.data(), refw, boundw) <= 1);
    std::vector<uint16_t> dx16(dx.size(), 0xFFFF), dx16b(dx.size());
    ops.linear_backward(sw::GradIn::set(nullptr, dx16.data()), nullptr, nullptr, dy.data(),
                        x.data(), w.data(), N, C, OC);
    Vec both(dx.size(), NAN);
    ops.linear_backward(sw::GradIn::set(both.data(), dx16b.data()), nullptr, nullptr, dy.data(),
                        x.data(), w.data(), N, C, OC);
    Vec dx16w(dx.size());
    int mismatch = 0;
    for (size_t i = 0; i < dx.size(); ++i) {
      dx16w[i] = sw::bf16_to_f32(dx16[i]);
      mismatch += dx16b[i] != sw::f32_to_bf16(both[i]);
    }
    CHECK(worst_ratio(dx16w.data(), ref, bound, 1.0 / 256) <= 1);
    CHECK(mismatch == 0);
  }
}

TEST_CASE("fp8: linear against the bf16 linear within the fp8 tolerance") {
  const sw::Fp8Ops ops(bf16(), {});
  const int N = 256, C = 384, OC = 192;
  const Vec x = swtest::randv(size_t(N) * C, 21, 1.f);
  const Vec w = swtest::randv(size_t(OC) * C, 22, 0.05f);
  const Vec dy = swtest::randv(size_t(N) * OC, 23, 1e-4f);
  Vec y8(size_t(N) * OC), y16(y8.size());
  ops.linear_forward(y8.data(), x.data(), w.data(), nullptr, nullptr, N, C, OC);
  bf16().linear_forward(y16.data(), x.data(), w.data(), nullptr, nullptr, N, C, OC);
  Vec dx8(size_t(N) * C, 0), dx16(dx8.size(), 0), dw8(w.size(), 0), dw16(w.size(), 0);
  ops.linear_backward(dx8.data(), dw8.data(), nullptr, dy.data(), x.data(), w.data(), N, C, OC);
  bf16().linear_backward(dx16.data(), dw16.data(), nullptr, dy.data(), x.data(), w.data(), N, C,
                         OC);
  const double ry = rel_rms(y8, y16), rx = rel_rms(dx8, dx16), rw = rel_rms(dw8, dw16);
  REPORT("fp8 vs bf16 relative rms: y " << ry << ", dinp " << rx << ", dw " << rw);
  CHECK(ry < 0.05);
  CHECK(rx < 0.08);
  CHECK(rw < 0.08);
  CHECK(ry > 1e-3);  // (the fp8 path ran: bf16 alone would differ far less)
}

TEST_CASE("fp8: delayed scaling takes the scale from the amax history") {
  sw::Fp8Recipe r;
  r.delayed = true;
  r.amax_history = 4;
  const sw::Fp8Ops ops(bf16(), r);
  const int N = 32, C = 64, OC = 48;
  const Vec x = swtest::randv(size_t(N) * C, 31, 1.f);
  const Vec w = swtest::randv(size_t(OC) * C, 32, 0.05f);
  Vec xs = x;
  for (float& v : xs) v *= 0.25f;
  Vec y1(size_t(N) * OC), y2(y1.size());
  ops.linear_forward(y1.data(), x.data(), w.data(), nullptr, nullptr, N, C, OC);   // current
  ops.linear_forward(y2.data(), xs.data(), w.data(), nullptr, nullptr, N, C, OC);  // history
  float amx = 0;
  for (float v : x) amx = std::max(amx, std::fabs(v));
  const float sx = sw::fp8_scale(amx, Fp8Format::E4M3);  // the first call's amax
  float iw;
  const Vec wq = quant(w, Fp8Format::E4M3, &iw);
  Vec xq(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) xq[i] = sw::round_fp8(xs[i] * sx, Fp8Format::E4M3);
  std::vector<double> ref, bound;
  ref_tn(N, OC, C, xq, wq, (1.f / sx) * iw, nullptr, ref, bound);
  CHECK(worst_ratio(y2.data(), ref, bound) <= 1);
  // current scaling would have used x/4's own amax: a different result
  const sw::Fp8Ops cur(bf16(), {});
  Vec y3(y1.size());
  cur.linear_forward(y3.data(), xs.data(), w.data(), nullptr, nullptr, N, C, OC);
  CHECK(!swtest::same_bits(y2, y3));
}

TEST_CASE("fp8: the decorator wraps bf16 Ops only") {
  CHECK_THROWS_WITH(sw::Fp8Ops(sw::ops_for(sw::Device::cpu()), {}),
                    Catch::Contains("fp8 needs bf16 mixed precision"));
  const sw::Fp8Ops ops(bf16(), {});
  CHECK(ops.compute() == sw::DType::BF16);
  CHECK(ops.device() == sw::Device::cpu());
}
