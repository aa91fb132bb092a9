// Block quantisation (sharding/comm/quantize.h): round-trip error bounds, packing, determinism
// and error feedback, against a scalar reference written here; the quantised collectives on a
// one-rank group. The multi-rank collectives: test_quantize_mpi.cpp.
#include <catch2/catch.hpp>
#include <omp.h>
#include <cmath>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "sharding/comm/quantize.h"

using namespace sw;

namespace {

std::vector<float> randn(size_t n, uint64_t seed, float sd = 1.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = d(g);
  return x;
}

std::vector<float> roundtrip(const std::vector<float>& x, const QuantSpec& q) {
  std::vector<uint8_t> w(static_cast<size_t>(quant_packed_bytes(int64_t(x.size()), q)));
  quantize(x.data(), int64_t(x.size()), q, w.data());
  std::vector<float> y(x.size());
  dequantize(w.data(), int64_t(x.size()), q, y.data());
  return y;
}

}  // namespace

TEST_CASE("quantize: round trip within absmax/qmax/2 per value, int8 and int4", "[quantize]") {
  for (int bits : {8, 4})
    for (int64_t block : {256, 64, 7, 1}) {
      const QuantSpec q{bits, block};
      for (size_t n : {size_t(1), size_t(255), size_t(1000), size_t(4097)}) {
        std::vector<float> x = randn(n, 7 + n + size_t(block), 3.f);
        x[0] = 0.f;
        const std::vector<float> y = roundtrip(x, q);
        double max_rel = 0;
        for (size_t b = 0; b * size_t(block) < n; ++b) {
          const size_t lo = b * size_t(block), hi = std::min(n, lo + size_t(block));
          float amax = 0;
          for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
          const float bound = amax / float(q.qmax()) / 2.f;
          for (size_t i = lo; i < hi; ++i) {
            INFO("bits " << bits << " block " << block << " n " << n << " i " << i);
            REQUIRE(std::fabs(x[i] - y[i]) <= bound * (1 + 1e-6f));
            if (amax > 0) max_rel = std::max(max_rel, double(std::fabs(x[i] - y[i]) / bound));
          }
          // the block's absmax value itself is exact (code +-qmax)
        }
        // the bound is tight, not loose by construction (block 1: every value is its block's
        // absmax, exact)
        if (n > 100 && block > 1) REQUIRE(max_rel > 0.5);
      }
    }
}

TEST_CASE("quantize: packed size, zeros, non-finite blocks, determinism", "[quantize]") {
  const QuantSpec q8{8, 256}, q4{4, 256};
  // 1000 values: 4 blocks -> 16 bytes of scales + codes, padded to 4
  REQUIRE(quant_packed_bytes(1000, q8) == 16 + 1000);
  REQUIRE(quant_packed_bytes(1000, q4) == 16 + 500);
  REQUIRE(quant_packed_bytes(1001, q4) == 16 + 504);
  // 1/4 and 1/8 of fp32 plus the scales
  REQUIRE(quant_packed_bytes(1 << 20, q8) == (1 << 20) + (1 << 14));
  REQUIRE(quant_packed_bytes(1 << 20, q4) == (1 << 19) + (1 << 14));
  std::vector<float> z(300, 0.f);
  for (float v : roundtrip(z, q8)) REQUIRE(v == 0.f);
  std::vector<float> x = randn(600, 3);
  x[10] = INFINITY;
  const std::vector<float> y = roundtrip(x, q4);
  for (int i = 0; i < 256; ++i) REQUIRE(std::isnan(y[size_t(i)]));  // the block with the inf
  for (int i = 256; i < 600; ++i) REQUIRE(std::isfinite(y[size_t(i)]));
  // deterministic: the same bytes twice, and round half to even
  std::vector<uint8_t> a(size_t(quant_packed_bytes(600, q8))), b(a.size());
  quantize(x.data(), 600, q8, a.data());
  quantize(x.data(), 600, q8, b.data());
  REQUIRE(a == b);
  const std::vector<float> h{254.f, 1.f, 3.f, -1.f};  // scale 2: 0.5 -> 0, 1.5 -> 2, -0.5 -> -0
  const std::vector<float> hy = roundtrip(h, QuantSpec{8, 4});
  REQUIRE(hy == std::vector<float>{254.f, 0.f, 4.f, 0.f});
}

TEST_CASE("quantize: error feedback: what was sent over K steps sums to the true sum",
          "[quantize]") {
  for (int bits : {8, 4}) {
    const QuantSpec q{bits, 64};
    const int64_t n = 1000;
    const int K = 200;
    std::vector<float> err(size_t(n), 0.f), sent_sum(size_t(n), 0.f), true_sum(size_t(n), 0.f),
        plain_sum(size_t(n), 0.f), y(size_t(n), 0.f);
    std::vector<uint8_t> w(size_t(quant_packed_bytes(n, q)));
    double max_res = 0;
    for (int k = 0; k < K; ++k) {
      // a gradient with a small persistent bias that one quantisation alone would round away
      // (and a small step-to-step variation)
      std::vector<float> g(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        g[size_t(i)] = 0.01f * float(i % 7) + 0.001f * float(k % 3) + (i % 64 == 0 ? 5.f : 0.f);
      quantize_ef(g.data(), err.data(), n, q, w.data());
      dequantize(w.data(), n, q, y.data());
      const std::vector<float> p = roundtrip(g, q);
      for (int64_t i = 0; i < n; ++i) {
        sent_sum[size_t(i)] += y[size_t(i)];
        true_sum[size_t(i)] += g[size_t(i)];
        plain_sum[size_t(i)] += p[size_t(i)];
        max_res = std::max(max_res, double(std::fabs(err[size_t(i)])));
      }
    }
    // the residual stays within one quantisation step (absmax/qmax/2 of a block: 5/qmax/2)
    const double step = (5.0 + 0.1) / q.qmax() / 2;
    REQUIRE(max_res <= step * 1.01);
    double ef_gap = 0, plain_gap = 0;
    for (int64_t i = 0; i < n; ++i) {
      // sum sent = sum true - residual, exactly up to fp32 rounding of the sums
      REQUIRE(std::fabs(sent_sum[size_t(i)] + err[size_t(i)] - true_sum[size_t(i)]) <=
              1e-3 * (1 + std::fabs(true_sum[size_t(i)])));
      ef_gap = std::max(ef_gap, double(std::fabs(sent_sum[size_t(i)] - true_sum[size_t(i)])));
      plain_gap =
          std::max(plain_gap, double(std::fabs(plain_sum[size_t(i)] - true_sum[size_t(i)])));
    }
    REQUIRE(ef_gap <= step * 1.01 + 1e-3 * K);
    REQUIRE(plain_gap > 10 * ef_gap);  // without feedback the bias is lost step after step
  }
}

TEST_CASE("quantize: collectives on a one-rank group", "[quantize]") {
  GroupPtr g = make_local_group();
  PeerCommPtr pc = make_peer_comm(*g, "quant-test");
  const QuantSpec q{8, 32};
  std::vector<float> x = randn(100, 9), out(100);
  Buffer wire;
  issue_quantized_all_gather(*g, x.data(), 100, q, wire).wait();
  finish_quantized_all_gather(*g, wire, 100, q, out.data());
  REQUIRE(out == roundtrip(x, q));
  std::vector<float> err(100, 0.f), rs(100);
  quantized_reduce_scatter(*pc, x.data(), err.data(), rs.data(), 100, q, 0.5f);
  const std::vector<float> r = roundtrip(x, q);
  for (size_t i = 0; i < 100; ++i) {
    REQUIRE(rs[i] == r[i] * 0.5f);
    REQUIRE(std::fabs(err[i] - (x[i] - r[i])) <= 1e-6f * std::fabs(x[i]));  // (fma)
  }
}

TEST_CASE("quantize: block tables: blocks restart at each tensor, 1-D tensors exact",
          "[quantize]") {
  // tensors at 0 (matrix), 10 (bias, exact), 300 (matrix), 301 (odd start), 700 (exact)
  const std::vector<int64_t> tstarts{0, 10, 300, 301, 700};
  const std::vector<uint8_t> traw{0, 1, 0, 0, 1};
  std::vector<uint8_t> raw;
  const std::vector<int64_t> st = quant_block_starts(0, 1000, tstarts, 128, &traw, &raw);
  REQUIRE(st == std::vector<int64_t>{0, 10, 138, 266, 300, 301, 429, 557, 685, 700, 828, 956});
  REQUIRE(raw == std::vector<uint8_t>{0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1});
  // a shard [250, 750) of the same buffer: cuts relative to 250, the grid restarting at it
  std::vector<uint8_t> raw2;
  REQUIRE(quant_block_starts(250, 750, tstarts, 128, &traw, &raw2) ==
          std::vector<int64_t>{0, 50, 51, 179, 307, 435, 450});
  REQUIRE(raw2 == std::vector<uint8_t>{1, 0, 0, 0, 0, 0, 1});
  for (int bits : {8, 4}) {
    QuantSpec q{bits, 128};
    q.starts = &st, q.raw = &raw;
    std::vector<float> x = randn(1000, 5, 2.f);
    for (int i = 300; i < 301; ++i) x[size_t(i)] = 100.f;  // a one-value tensor: its own scale
    std::vector<uint8_t> w(size_t(quant_packed_bytes(1000, q)));
    // 12 scales + codes + the exact values (10..300 and 700..1000: 590 values)
    REQUIRE(int64_t(w.size()) == (48 + (bits == 8 ? 1000 : 500) + 590 * 4 + 3) / 4 * 4);
    quantize(x.data(), 1000, q, w.data());
    std::vector<float> y(1000);
    dequantize(w.data(), 1000, q, y.data());
    for (size_t b = 0; b < st.size(); ++b) {
      const size_t lo = size_t(st[b]), hi = b + 1 < st.size() ? size_t(st[b + 1]) : 1000;
      float amax = 0;
      for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
      for (size_t i = lo; i < hi; ++i) {
        INFO("bits " << bits << " block " << b << " i " << i);
        if (raw[b])
          REQUIRE(y[i] == x[i]);
        else
          REQUIRE(std::fabs(y[i] - x[i]) <= amax / float(q.qmax()) / 2 * (1 + 1e-6f));
      }
    }
    REQUIRE(y[300] == 100.f);  // alone in its block: exact (code qmax)
    // error feedback leaves no residual on the exact blocks
    std::vector<float> err(1000, 0.f);
    quantize_ef(x.data(), err.data(), 1000, q, w.data());
    std::vector<float> y2(1000);
    dequantize(w.data(), 1000, q, y2.data());
    for (size_t i = 0; i < 1000; ++i) {
      REQUIRE(y2[i] == y[i]);
      REQUIRE(std::fabs(err[i] - (x[i] - y[i])) <= 1e-6f * (1 + std::fabs(x[i])));
    }
  }
}

TEST_CASE("quantize: the worker runs calls in issue order, off the caller, failures in the Work",
          "[quantize]") {
  std::vector<int> order;
  std::vector<Work> w;
  std::thread::id caller = std::this_thread::get_id(), ran;
  {
    QuantWorker qw;
    for (int i = 0; i < 50; ++i)
      w.push_back(qw.issue([&order, &ran, i] {
        order.push_back(i);
        ran = std::this_thread::get_id();
      }));
    Work bad = qw.issue([] { throw std::runtime_error("peer 3 went away"); });
    Work after = qw.issue([&order] { order.push_back(-1); });
    for (Work& x : w) x.wait();
    CHECK_THROWS_WITH(bad.wait(), "peer 3 went away");
    after.wait();
  }
  REQUIRE(order.size() == 51);
  for (int i = 0; i < 50; ++i) CHECK(order[size_t(i)] == i);
  CHECK(order.back() == -1);
  CHECK(ran != caller);
}

TEST_CASE("quantize: the worker's thread runs on_start before any call (its OpenMP team size)",
          "[quantize]") {
  // A new thread starts from OpenMP's initial team size, not the caller's: the model passes
  // set_num_threads(its count) as on_start so the quantisers' parallel loops keep to it.
  const int want = omp_get_max_threads() > 1 ? 1 : 2;
  int seen = 0;
  {
    QuantWorker qw([want] { omp_set_num_threads(want); });
    qw.issue([&seen] { seen = omp_get_max_threads(); }).wait();
  }
  CHECK(seen == want);
}
