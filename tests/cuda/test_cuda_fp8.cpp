// The CUDA fp8 linears (kernels/cuda/fp8.cu under kernels/fp8_ops.h's Fp8Ops) against the CPU
// twin on the same inputs. Without a GPU, main() checks that the CUDA fp8 kernels are
// registered, then exits 77 (ctest: skipped).
//
//  * amax and scales: the same floats as the CPU's (a max is order-free).
//  * quantize: the fp8 bytes decoded on the host are round_fp8 of x * scale, bit for bit, on
//    PyTorch's fixture inputs (tests/kernels/data/fp8_reference.txt) and random tensors,
//    transposed or not.
//  * the linear forward (fp32 and bf16 outputs, bias, residual) and backward (dinp added,
//    written, 16-bit; dw; db): both backends multiply the same fp8 values, so they differ only
//    by fp32 summation order and the bias's place: within 2 (K + 2) u sum|a b| / (s_a s_b)
//    (+ a bf16 unit for 16-bit outputs). A shape cuBLASLt's fp8 matmul does not take (not a
//    multiple of 16) runs the bf16 product: compared with the CPU's bf16 linear instead.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/alloc.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/fp8_ops.h"

namespace {

using sw::Buffer;
using sw::Device;
using sw::DType;
using sw::Fp8Format;
using Vec = std::vector<float>;
constexpr double kU = 1.0 / (1 << 24);

Vec randv(size_t n, uint32_t seed, float scale) {
  Vec v(n);
  uint32_t st = seed * 2654435761u + 1;
  for (float& x : v) {
    st = st * 1664525u + 1013904223u;
    x = (static_cast<float>(st >> 8) / 16777216.f - 0.5f) * 2.f * scale;
  }
  return v;
}

Buffer up(const Vec& v) {
  Buffer b(std::max<size_t>(v.size(), 1) * 4, sw::Mem::Workspace, sw::test::gpu());
  sw::copy_bytes(b.data(), sw::test::gpu(), v.data(), Device::cpu(), v.size() * 4);
  return b;
}
Vec down(const float* d, size_t n) {
  Vec v(n);
  sw::copy_bytes(v.data(), Device::cpu(), d, sw::test::gpu(), n * 4);
  return v;
}
std::vector<uint16_t> down16(const uint16_t* d, size_t n) {
  std::vector<uint16_t> v(n);
  sw::copy_bytes(v.data(), Device::cpu(), d, sw::test::gpu(), n * 2);
  return v;
}

// An fp8 byte's value (E4M3: bias 7, 0x7f / 0xff NaN; E5M2: bias 15, exponent 31 inf / NaN).
float decode(uint8_t b, Fp8Format f) {
  const bool neg = b & 0x80;
  const int mb = f == Fp8Format::E4M3 ? 3 : 2, bias = f == Fp8Format::E4M3 ? 7 : 15;
  const int e = (b & 0x7f) >> mb, m = b & ((1 << mb) - 1);
  float v;
  if (f == Fp8Format::E4M3 && (b & 0x7f) == 0x7f)
    v = NAN;
  else if (f == Fp8Format::E5M2 && e == 31)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = std::ldexp(float(m), 1 - bias - mb);
  else
    v = std::ldexp(float((1 << mb) + m), e - bias - mb);
  return neg ? -v : v;
}

const sw::Ops& gpu_bf16() { return sw::ops_for(sw::test::gpu(), DType::BF16); }
const sw::Ops& cpu_bf16() { return sw::ops_for(Device::cpu(), DType::BF16); }

// sum_k |a_k b_k| / (s_a s_b) per element of A(M, K) B(N, K)^T on quantised operands.
std::vector<double> sabs(int M, int N, int K, const Vec& a, const Vec& b) {
  float sa_inv = 0, sb_inv = 0;
  float am = 0, bm = 0;
  for (float v : a) am = std::max(am, std::fabs(v));
  for (float v : b) bm = std::max(bm, std::fabs(v));
  const float sa = sw::fp8_scale(am, Fp8Format::E4M3), sb = sw::fp8_scale(bm, Fp8Format::E4M3);
  sa_inv = 1 / sa, sb_inv = 1 / sb;
  std::vector<double> s(size_t(M) * N, 0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double t = 0;
      for (int k = 0; k < K; ++k)
        t += std::fabs(double(sw::round_fp8(a[size_t(i) * K + k] * sa, Fp8Format::E4M3)) *
                       sw::round_fp8(b[size_t(j) * K + k] * sb, Fp8Format::E4M3));
      s[size_t(i) * N + j] = t * sa_inv * sb_inv;
    }
  return s;
}

double worst(const Vec& got, const Vec& want, const std::vector<double>& bound, double rel) {
  double w = 0;
  for (size_t i = 0; i < got.size(); ++i)
    w = std::max(
        w, std::fabs(double(got[i]) - want[i]) / (bound[i] + rel * std::fabs(want[i]) + 1e-30));
  return w;
}

}  // namespace

TEST_CASE("cuda fp8: amax, scales and quantize match the CPU twin bit for bit") {
  const sw::Fp8Kernels& g = *sw::fp8_kernels(sw::DeviceKind::CUDA);
  std::ifstream f(std::string(SW_SOURCE_DIR) + "/tests/kernels/data/fp8_reference.txt");
  REQUIRE(f);
  Vec xs;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    uint32_t xb;
    is >> std::hex >> xb;
    float x;
    std::memcpy(&x, &xb, 4);
    if (!std::isnan(x)) xs.push_back(x);  // (amax skips NaN either way; kept out of the max)
  }
  const Vec rnd = randv(96 * 160, 5, 40.f);
  for (const Vec* in : {static_cast<const Vec*>(&xs), &rnd})
    for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2})
      for (bool tr : {false, true}) {
        const Vec& x = *in;
        const int rows = in == &rnd ? 96 : 1, cols = int(x.size()) / rows;
        Buffer dx = up(x);
        Buffer s(16 * 4, sw::Mem::Workspace, sw::test::gpu());
        Buffer q(x.size() + 16, sw::Mem::Workspace, sw::test::gpu());
        float* sp = s.f32();
        g.amax(sp + 2, dx.f32(), x.size());
        g.scales(sp, sp + 2, 1, fmt, false);
        g.quantize(q.data(), fmt, sp, dx.f32(), rows, cols, tr);
        const Vec hs = down(sp, 3);
        float am = 0;
        for (float v : x) am = std::max(am, std::fabs(v));
        CHECK(hs[2] == am);
        CHECK(hs[0] == sw::fp8_scale(am, fmt));
        const std::vector<uint8_t> qb = sw::test::download(q.data(), x.size());
        int bad = 0;
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < cols; ++c) {
            const size_t i = size_t(r) * cols + c;
            const float want = sw::round_fp8(x[i] * hs[0], fmt);
            const float got = decode(qb[tr ? size_t(c) * rows + r : i], fmt);
            bad += !(got == want || (std::isnan(got) && std::isnan(want)));
          }
        CHECK(bad == 0);
      }
}

TEST_CASE("cuda fp8: the linear against the CPU twin") {
  const sw::Fp8Ops gops(gpu_bf16(), {}), cops(cpu_bf16(), {});
  for (auto [N, C, OC] : {std::tuple{256, 384, 192}, std::tuple{128, 64, 96}}) {
    INFO("N " << N << " C " << C << " OC " << OC);
    const Vec x = randv(size_t(N) * C, 1, 2.f), w = randv(size_t(OC) * C, 2, 0.05f),
              b = randv(OC, 3, 0.1f), dy = randv(size_t(N) * OC, 4, 1e-3f),
              res = randv(size_t(N) * OC, 6, 1.f);
    Buffer gx = up(x), gw = up(w), gb = up(b), gdy = up(dy), gres = up(res);
    // forward, fp32 out + bias
    Vec y(size_t(N) * OC);
    cops.linear_forward(y.data(), x.data(), w.data(), b.data(), nullptr, N, C, OC);
    Buffer gy(y.size() * 4, sw::Mem::Workspace, sw::test::gpu());
    gops.linear_forward(gy.f32(), gx.f32(), gw.f32(), gb.f32(), nullptr, N, C, OC);
    std::vector<double> bound = sabs(N, OC, C, x, w);
    for (double& v : bound) v *= 2 * (C + 2) * kU;
    CHECK(worst(down(gy.f32(), y.size()), y, bound, 4 * kU) <= 1);
    // bf16 out + bias
    Buffer gy16(y.size() * 2, sw::Mem::Workspace, sw::test::gpu());
    gops.linear_forward(reinterpret_cast<uint16_t*>(gy16.data()), gx.f32(), gw.f32(), gb.f32(),
                        nullptr, N, C, OC);
    const std::vector<uint16_t> h16 = down16(reinterpret_cast<uint16_t*>(gy16.data()), y.size());
    Vec y16(y.size());
    for (size_t i = 0; i < y.size(); ++i) y16[i] = sw::bf16_to_f32(h16[i]);
    CHECK(worst(y16, y, bound, 1.0 / 256) <= 1);
    // fp32 out with the residual
    Vec yr(y.size());
    cops.linear_forward(yr.data(), x.data(), w.data(), b.data(), res.data(), N, C, OC);
    gops.linear_forward(gy.f32(), gx.f32(), gw.f32(), gb.f32(), gres.f32(), N, C, OC);
    CHECK(worst(down(gy.f32(), y.size()), yr, bound, 4 * kU) <= 1);

    // backward: dinp written, dw written, db added; magnitudes bounded through the max
    // products (a looser bound: 2 (K + 2) u K max|a| max|b| / scales would need the
    // quantised values; the relative rms against the twin is checked instead)
    Vec dx(size_t(N) * C, 0.f), dw(w.size(), 0.f), db(OC, 0.25f);
    cops.linear_backward(sw::GradIn::set(dx.data()), sw::GradOut(dw.data(), true), db.data(),
                         dy.data(), x.data(), w.data(), N, C, OC);
    Buffer gdx(dx.size() * 4, sw::Mem::Workspace, sw::test::gpu()),
        gdw(dw.size() * 4, sw::Mem::Workspace, sw::test::gpu()), gdb = up(Vec(OC, 0.25f));
    gops.linear_backward(sw::GradIn::set(gdx.f32()), sw::GradOut(gdw.f32(), true), gdb.f32(),
                         gdy.f32(), gx.f32(), gw.f32(), N, C, OC);
    auto rel_rms = [](const Vec& a, const Vec& r) {
      double n = 0, d = 0;
      for (size_t i = 0; i < a.size(); ++i)
        n += (a[i] - r[i]) * double(a[i] - r[i]), d += r[i] * double(r[i]);
      return std::sqrt(n / d);
    };
    const double ex = rel_rms(down(gdx.f32(), dx.size()), dx),
                 ew = rel_rms(down(gdw.f32(), dw.size()), dw),
                 eb = rel_rms(down(gdb.f32(), size_t(OC)), db);
    INFO("backward rel rms vs the twin: dinp " << ex << ", dw " << ew << ", db " << eb);
    CHECK(ex < 1e-5);  // the same fp8 values, fp32 sums in other orders
    CHECK(ew < 1e-5);
    CHECK(eb < 1e-5);
  }
}

TEST_CASE("cuda fp8: a shape cuBLASLt's fp8 matmul does not take runs the bf16 product") {
  const sw::Fp8Ops gops(gpu_bf16(), {});
  const int N = 33, C = 40, OC = 24;
  const Vec x = randv(size_t(N) * C, 7, 1.f), w = randv(size_t(OC) * C, 8, 0.1f);
  Buffer gx = up(x), gw = up(w), gy(size_t(N) * OC * 4, sw::Mem::Workspace, sw::test::gpu());
  gops.linear_forward(gy.f32(), gx.f32(), gw.f32(), nullptr, nullptr, N, C, OC);
  Vec y(size_t(N) * OC);
  cpu_bf16().linear_forward(y.data(), x.data(), w.data(), nullptr, nullptr, N, C, OC);
  const Vec g = down(gy.f32(), y.size());
  double w8 = 0;
  for (size_t i = 0; i < y.size(); ++i) w8 = std::max(w8, double(std::fabs(g[i] - y[i])));
  CHECK(w8 < 1e-4);  // bf16 products of the same rounded operands (fp32 order only)
}

int main(int argc, char** argv) {
  if (!sw::fp8_kernels(sw::DeviceKind::CUDA)) {
    std::printf("FAIL: the CUDA fp8 kernels are not registered\n");
    return 1;
  }
  if (sw::cuda_device_count() == 0) {
    std::printf("no CUDA device: skipping the CUDA fp8 tests (fp8 kernels registered)\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
