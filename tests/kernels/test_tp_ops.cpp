// The CPU kernels of tensor parallelism (kernels/ops.h "Tensor parallelism"; kernels/cpu/
// tp_kernels.cpp), through the Ops (fp32 and BF16):
//  * each op against a naive double-precision loop written here (random data, targets -1 and
//    targets and tokens outside the shard's range, a shard not at the start of the table, runs
//    of rows wrapping past T, more rows than one logits chunk);
//  * exact identities: the vocabulary shards' lookups summed over t = 3 uneven shards, then
//    position_forward, give embedding_forward's bits; the shards' table gradients and the
//    positions' gradient give embedding_backward's bits;
//  * the head split into t = 1, 2, 3 (uneven) vocabulary shards: stats per shard, combine,
//    backward per shard reproduce lmhead_xent's losses, dx and dw (the shards' dw
//    concatenated), fp32 and BF16 Ops, and the BF16 head's weight given fp32, 16-bit or both
//    gives the same bits;
//  * the forms: dw written (over NaN garbage) equals dw added into zeros; bit-identical reruns;
//  * the simulated device (tests/common/sim_device.h) runs the eight from device memory with
//    the CPU's bits (a host pointer would end the test with exit code 87).
// Tolerances: the double references allow 2e-5 of the largest magnitude (fp32 sums of <= C or
// <= N products with exp_approx's ~2 ulp: measured <= 8e-7); the split against lmhead_xent
// 1e-5 relative, as the largest difference over the largest magnitude of the tensor (fp32;
// measured <= 5e-7) and as the Euclidean norm of the difference over the tensor's (fp32 and
// BF16; measured <= 4e-6); BF16's largest difference 1e-4 (why: at the check; measured 3.5e-5).
// Measured values are printed with SHARDWISE_TEST_VERBOSE=1.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/alloc.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

using namespace swtest;
using sw::DType;

namespace {

const sw::Ops& cpu(DType t = DType::F32) { return sw::ops_for(sw::Device::cpu(), t); }

// Ids in [0, V) with every `skip`-th one -1 (skip 0: none).
std::vector<int32_t> rand_ids(int n, int V, uint64_t seed, int skip) {
  sw::Rng r(seed);
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = skip && i % skip == skip - 1 ? -1 : int32_t(r.next() % V);
  return ids;
}

// max |a - b| / max |b| (b the reference), 0 where both are all zero.
template <class A, class B>
double rel_err(const A& a, const B& b) {
  REQUIRE(a.size() == b.size());
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return m > 0 ? d / m : d;
}

// ||a - b|| / ||b|| (Euclidean norms; b the reference).
template <class A, class B>
double norm_err(const A& a, const B& b) {
  REQUIRE(a.size() == b.size());
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = double(a[i]) - double(b[i]);
    d += e * e;
    m += double(b[i]) * double(b[i]);
  }
  return m > 0 ? std::sqrt(d / m) : std::sqrt(d);
}

// The shards' boundaries: t uneven pieces of V (cut k at V k (k + 3) / (t (t + 3))).
std::vector<int> cuts(int V, int t) {
  std::vector<int> c;
  for (int k = 0; k <= t; ++k) c.push_back(V * k * (k + 3) / (t * (t + 3)));
  return c;
}

Vec round_bf16(const Vec& x) {
  Vec r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = sw::bf16_to_f32(sw::f32_to_bf16(x[i]));
  return r;
}
std::vector<uint16_t> to_bf16(const Vec& x) {
  std::vector<uint16_t> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = sw::f32_to_bf16(x[i]);
  return r;
}

}  // namespace

TEST_CASE("tp ops: embedding shard lookups and positions against a naive loop and embedding_forward's bits") {
  const int B = 3, T = 13, C = 37, Vt = 50, N = B * T;
  const Vec wte = randv((size_t)Vt * C, 1), wpe = randv((size_t)T * C, 2);
  const std::vector<int32_t> tok = rand_ids(N, Vt, 3, 0);
  const auto& ops = cpu();

  SECTION("one shard against the naive loop; positions of a run wrapping past T") {
    const int64_t v_lo = 17;
    const int V = 20;
    Vec out((size_t)N * C, 7.f);
    ops.vocab_embedding_forward(out.data(), tok.data(), wte.data() + v_lo * C, v_lo, N, C, V);
    int hits = 0;
    for (int n = 0; n < N; ++n) {
      const bool in = tok[n] >= v_lo && tok[n] < v_lo + V;
      hits += in;
      for (int c = 0; c < C; ++c)
        REQUIRE(out[(size_t)n * C + c] == (in ? wte[(size_t)tok[n] * C + c] : 0.f));
    }
    REQUIRE(hits > 0);
    REQUIRE(hits < N);
    // position_forward on rows [row_lo, row_lo + rows) of the flattened batch.
    const int64_t row_lo = 9;
    const int rows = 2 * T + 4;
    Vec p = randv((size_t)rows * C, 4), p0 = p;
    ops.position_forward(p.data(), wpe.data(), row_lo, rows, T, C);
    DVec ref(p.size());
    for (int i = 0; i < rows; ++i)
      for (int c = 0; c < C; ++c)
        ref[(size_t)i * C + c] = double(p0[(size_t)i * C + c]) + wpe[((row_lo + i) % T) * C + c];
    REQUIRE(rel_err(p, ref) <= 1e-7);
  }

  SECTION("shards summed, then positions: embedding_forward's bits (fp32 and 16-bit tables)") {
    for (DType t : {DType::F32, DType::BF16}) {
      const auto& o = cpu(t);
      const std::vector<uint16_t> w16 = to_bf16(wte);
      Vec full((size_t)N * C);
      if (t == DType::F32)
        o.embedding_forward(full.data(), tok.data(), wte.data(), wpe.data(), B, T, C, Vt);
      else
        o.embedding_forward(full.data(), tok.data(), w16.data(), wpe.data(), B, T, C, Vt);
      const std::vector<int> cut = cuts(Vt, 3);
      Vec sum((size_t)N * C, 0.f), part((size_t)N * C);
      for (int k = 0; k < 3; ++k) {
        const int64_t lo = cut[k];
        const int V = cut[k + 1] - cut[k];
        if (t == DType::F32)
          o.vocab_embedding_forward(part.data(), tok.data(), wte.data() + lo * C, lo, N, C, V);
        else
          o.vocab_embedding_forward(part.data(), tok.data(), w16.data() + lo * C, lo, N, C, V);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
      }
      // The sequence-parallel halves: rows [0, 20) and [20, N).
      o.position_forward(sum.data(), wpe.data(), 0, 20, T, C);
      o.position_forward(sum.data() + 20 * C, wpe.data(), 20, N - 20, T, C);
      REQUIRE(same_bits(sum, full));
    }
  }
}

TEST_CASE("tp ops: embedding backward: naive loop, embedding_backward's bits, row order") {
  const int B = 4, T = 11, C = 45, Vt = 40, N = B * T;
  const Vec dout = randv((size_t)N * C, 5);
  std::vector<int32_t> tok = rand_ids(N, Vt, 6, 0);
  tok[3] = tok[7] = tok[20] = 21;  // repeated rows collide
  const auto& ops = cpu();
  // The whole table's and positions' gradients, added into prefilled buffers.
  const Vec dwte0 = randv((size_t)Vt * C, 7), dwpe0 = randv((size_t)T * C, 8);
  Vec dwte = dwte0, dwpe = dwpe0;
  ops.embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);

  const std::vector<int> cut = cuts(Vt, 3);
  Vec shards = dwte0;  // the shards' tables side by side
  for (int k = 0; k < 3; ++k) {
    const int64_t lo = cut[k];
    const int V = cut[k + 1] - cut[k];
    ops.vocab_embedding_backward(shards.data() + lo * C, dout.data(), tok.data(), lo, N, C, V);
  }
  REQUIRE(same_bits(shards, dwte));
  Vec p = dwpe0;
  ops.position_backward(p.data(), dout.data(), 0, N, T, C);
  REQUIRE(same_bits(p, dwpe));

  // Against a naive loop: one shard not at the start, and positions of a run from row_lo.
  const int64_t lo = 13;
  const int V = 15, row_lo = 5, rows = N - 9;
  Vec g = dwte0;
  ops.vocab_embedding_backward(g.data(), dout.data(), tok.data(), lo, N, C, V);
  DVec ref(dwte0.begin(), dwte0.end());
  for (int n = 0; n < N; ++n)
    if (tok[n] >= lo && tok[n] < lo + V)
      for (int c = 0; c < C; ++c) ref[(tok[n] - lo) * C + c] += dout[(size_t)n * C + c];
  REQUIRE(rel_err(g, ref) <= 1e-6);
  for (size_t i = (size_t)V * C; i < g.size(); ++i) REQUIRE(g[i] == dwte0[i]);  // past V: untouched
  Vec q = dwpe0;
  ops.position_backward(q.data(), dout.data() + (size_t)row_lo * C, row_lo, rows, T, C);
  DVec qref(dwpe0.begin(), dwpe0.end());
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < C; ++c) qref[((row_lo + i) % T) * C + c] += dout[(size_t)(row_lo + i) * C + c];
  REQUIRE(rel_err(q, qref) <= 1e-6);
}

namespace {

// Full logits of one shard in double: h (N,C) @ w(V,C)^T, where w is the shard's rows.
DVec logits_ref(const Vec& h, const Vec& w, int N, int C, int V) {
  DVec L((size_t)N * V);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += double(h[(size_t)n * C + c]) * w[(size_t)v * C + c];
      L[(size_t)n * V + v] = s;
    }
  return L;
}

}  // namespace

TEST_CASE("tp ops: xent_shard_stats, combine and backward against naive double loops") {
  // N > 512 rows: two logits chunks.
  const int N = 600, C = 24, Vt = 70;
  const int64_t lo = 25;
  const int V = 30;
  const Vec h = randv((size_t)N * C, 11), wt = randv((size_t)Vt * C, 12, 0.5f);
  const Vec w(wt.begin() + lo * C, wt.begin() + (lo + V) * C);
  const std::vector<int32_t> tg = rand_ids(N, Vt, 13, 7);
  const auto& ops = cpu();
  const DVec L = logits_ref(h, w, N, C, V);

  Vec st((size_t)N * 3);
  ops.xent_shard_stats(st.data(), h.data(), w.data(), tg.data(), lo, N, C, V);
  DVec sref((size_t)N * 3);
  int in = 0;
  for (int n = 0; n < N; ++n) {
    double m = -1e300, s = 0;
    for (int v = 0; v < V; ++v) m = std::max(m, L[(size_t)n * V + v]);
    for (int v = 0; v < V; ++v) s += std::exp(L[(size_t)n * V + v] - m);
    const bool hit = tg[n] >= lo && tg[n] < lo + V;
    in += hit;
    sref[n * 3] = m, sref[n * 3 + 1] = s, sref[n * 3 + 2] = hit ? L[(size_t)n * V + tg[n] - lo] : 0;
  }
  REQUIRE(in > 10);
  double em = 0, es = 0, et = 0;
  for (int n = 0; n < N; ++n) {
    em = std::max(em, std::fabs(st[n * 3] - sref[n * 3]) / (1 + std::fabs(sref[n * 3])));
    es = std::max(es, std::fabs(st[n * 3 + 1] - sref[n * 3 + 1]) / sref[n * 3 + 1]);
    et = std::max(et, std::fabs(st[n * 3 + 2] - sref[n * 3 + 2]) / (1 + std::fabs(sref[n * 3 + 2])));
  }
  REPORT("stats errors: max " << em << " sum " << es << " target logit " << et);
  CHECK(em <= 2e-5);
  CHECK(es <= 2e-5);
  CHECK(et <= 2e-5);

  SECTION("combine from random stats of t = 3 ranks") {
    const int t = 3;
    Vec s3((size_t)t * N * 3);
    sw::Rng r(14);
    for (size_t i = 0; i < s3.size(); i += 3) {
      s3[i] = float(r.next() % 2000) / 100.f - 10.f;
      s3[i + 1] = 1.f + float(r.next() % 1000) / 10.f;
      s3[i + 2] = float(r.next() % 2000) / 100.f - 10.f;
    }
    Vec lse(N), loss(N, 99.f);
    double total = 0.5;
    ops.xent_shard_combine(&total, lse.data(), loss.data(), s3.data(), tg.data(), t, N);
    DVec lref(N), lossref(N);
    double tref = 0.5;
    for (int n = 0; n < N; ++n) {
      double M = -1e300, S = 0, tl = 0;
      for (int k = 0; k < t; ++k) M = std::max(M, double(s3[((size_t)k * N + n) * 3]));
      for (int k = 0; k < t; ++k) {
        const float* q = &s3[((size_t)k * N + n) * 3];
        S += q[1] * std::exp(q[0] - M);
        tl += q[2];
      }
      lref[n] = M + std::log(S);
      lossref[n] = tg[n] < 0 ? 0 : lref[n] - tl;
      tref += lossref[n];
      if (tg[n] < 0) REQUIRE(loss[n] == 0.f);
    }
    const double el = rel_err(lse, lref), eloss = rel_err(loss, lossref);
    REPORT("combine errors: lse " << el << " loss " << eloss << " total " << std::fabs(total - tref) / std::fabs(tref));
    CHECK(el <= 1e-6);
    CHECK(eloss <= 1e-6);
    CHECK(std::fabs(total - tref) <= 1e-6 * std::fabs(tref));
  }

  SECTION("backward: dh added into, dw added into and written, grad_scale, null outputs") {
    const float gs = 0.37f;
    // lse of the whole row as another shard would see it: this shard's plus something.
    Vec lse(N);
    for (int n = 0; n < N; ++n) lse[n] = float(sref[n * 3] + std::log(sref[n * 3 + 1]) + 0.5 + (n % 5) * 0.1);
    const Vec dh0 = randv((size_t)N * C, 15), dw0 = randv((size_t)V * C, 16);
    Vec dh = dh0, dw = dw0;
    ops.xent_shard_backward(dh.data(), dw.data(), h.data(), w.data(), lse.data(), tg.data(), lo, N, C, V, gs);
    DVec g((size_t)N * V, 0.0);
    for (int n = 0; n < N; ++n) {
      if (tg[n] < 0) continue;
      for (int v = 0; v < V; ++v) g[(size_t)n * V + v] = gs * std::exp(L[(size_t)n * V + v] - lse[n]);
      if (tg[n] >= lo && tg[n] < lo + V) g[(size_t)n * V + tg[n] - lo] -= gs;
    }
    DVec dhr(dh0.begin(), dh0.end()), dwr(dw0.begin(), dw0.end());
    for (int n = 0; n < N; ++n)
      for (int v = 0; v < V; ++v) {
        const double gv = g[(size_t)n * V + v];
        for (int c = 0; c < C; ++c) {
          dhr[(size_t)n * C + c] += gv * w[(size_t)v * C + c];
          dwr[(size_t)v * C + c] += gv * h[(size_t)n * C + c];
        }
      }
    const double eh = rel_err(dh, dhr), ew = rel_err(dw, dwr);
    REPORT("backward errors: dh " << eh << " dw " << ew);
    CHECK(eh <= 2e-5);
    CHECK(ew <= 2e-5);
    // Written dw over NaN garbage: the bits of adding into zeros; dh null.
    Vec wz((size_t)V * C, 0.f), ww((size_t)V * C, std::numeric_limits<float>::quiet_NaN());
    ops.xent_shard_backward(nullptr, wz.data(), h.data(), w.data(), lse.data(), tg.data(), lo, N, C, V, gs);
    ops.xent_shard_backward(nullptr, sw::GradOut(ww.data(), true), h.data(), w.data(), lse.data(), tg.data(), lo, N, C, V, gs);
    REQUIRE(same_bits(wz, ww));
    // dw null: dh as with both; a rerun gives the same bits.
    Vec dh2 = dh0, dw2 = dw0;
    ops.xent_shard_backward(dh2.data(), nullptr, h.data(), w.data(), lse.data(), tg.data(), lo, N, C, V, gs);
    REQUIRE(same_bits(dh2, dh));
    dh2 = dh0;
    ops.xent_shard_backward(dh2.data(), dw2.data(), h.data(), w.data(), lse.data(), tg.data(), lo, N, C, V, gs);
    REQUIRE(same_bits(dh2, dh));
    REQUIRE(same_bits(dw2, dw));
    // No rows: a written dw is zeros.
    ops.xent_shard_backward(nullptr, sw::GradOut(ww.data(), true), h.data(), w.data(), lse.data(), tg.data(), lo, 0, C, V, gs);
    for (float x : ww) REQUIRE(x == 0.f);
  }
}

TEST_CASE("tp ops: the head split into t vocabulary shards reproduces lmhead_xent (fp32, BF16)") {
  // N > 512 rows: the shards and lmhead_xent both run two chunks.
  const int N = 700, C = 40, Vt = 97;
  const Vec h = randv((size_t)N * C, 21), w0 = randv((size_t)Vt * C, 22, 0.4f);
  const std::vector<int32_t> tg = rand_ids(N, Vt, 23, 9);
  const float gs = 1.f / 600;
  for (DType dt : {DType::F32, DType::BF16}) {
    const auto& ops = cpu(dt);
    const Vec w = dt == DType::F32 ? w0 : round_bf16(w0);  // 16-bit exact: all forms agree
    const std::vector<uint16_t> w16 = to_bf16(w);
    Vec loss(N), dx((size_t)N * C, 0.f), dw((size_t)Vt * C, 0.f);
    const double total = ops.lmhead_xent(loss.data(), dx.data(), dw.data(), h.data(), w.data(), tg.data(), N, C, Vt, gs);
    for (int t : {1, 2, 3}) {
      const std::vector<int> cut = cuts(Vt, t);
      Vec stats((size_t)t * N * 3);
      for (int k = 0; k < t; ++k)
        ops.xent_shard_stats(stats.data() + (size_t)k * N * 3, h.data(), w.data() + (size_t)cut[k] * C, tg.data(), cut[k], N, C, cut[k + 1] - cut[k]);
      Vec lse(N), sl(N);
      double stotal = 0;
      ops.xent_shard_combine(&stotal, lse.data(), sl.data(), stats.data(), tg.data(), t, N);
      Vec sdx((size_t)N * C, 0.f), sdw((size_t)Vt * C, std::numeric_limits<float>::quiet_NaN());
      for (int k = 0; k < t; ++k)
        ops.xent_shard_backward(sdx.data(), sw::GradOut(sdw.data() + (size_t)cut[k] * C, true), h.data(), w.data() + (size_t)cut[k] * C, lse.data(), tg.data(), cut[k], N, C, cut[k + 1] - cut[k], gs);
      const double el = rel_err(sl, loss), ex = rel_err(sdx, dx), ew = rel_err(sdw, dw);
      const double nx = norm_err(sdx, dx), nw = norm_err(sdw, dw);
      REPORT(sw::dtype_name(dt) << " t=" << t << ": norm errors dx " << nx << " dw " << nw);
      REPORT(sw::dtype_name(dt) << " t=" << t << ": loss " << el << " total " << std::fabs(stotal - total) / total << " dx " << ex << " dw " << ew << (t == 1 && same_bits(sl, loss) ? " (losses bitwise)" : ""));
      CHECK(el <= 1e-5);
      CHECK(std::fabs(stotal - total) <= 1e-5 * std::fabs(total));
      CHECK(nx <= 1e-5);
      CHECK(nw <= 1e-5);
      // BF16: g is rounded to bf16 for the products, and the shards' g (from lse) and
      // lmhead_xent's (from max and sum) differ by an ulp or two of fp32 before that rounding,
      // so now and then one rounds to the neighbouring bf16 value (2^-8 apart): a few elements
      // move by that much of one term (measured: 3.5e-5 of the largest dx, 7e-6 of dw).
      const double tol = dt == DType::F32 ? 1e-5 : 1e-4;
      CHECK(ex <= tol);
      CHECK(ew <= tol);
      if (dt == DType::BF16 && t == 3) {
        // The weight 16-bit alone, or in both forms: the same bits.
        for (int form = 0; form < 2; ++form) {
          Vec st2((size_t)t * N * 3), dx2((size_t)N * C, 0.f), dw2((size_t)Vt * C, 0.f);
          for (int k = 0; k < t; ++k) {
            const size_t off = (size_t)cut[k] * C;
            const sw::Operand wk = form == 0 ? sw::Operand(w16.data() + off) : sw::Operand(w.data() + off, w16.data() + off);
            ops.xent_shard_stats(st2.data() + (size_t)k * N * 3, h.data(), wk, tg.data(), cut[k], N, C, cut[k + 1] - cut[k]);
            ops.xent_shard_backward(dx2.data(), dw2.data() + off, h.data(), wk, lse.data(), tg.data(), cut[k], N, C, cut[k + 1] - cut[k], gs);
          }
          REQUIRE(same_bits(st2, stats));
          REQUIRE(same_bits(dx2, sdx));
          REQUIRE(same_bits(dw2, sdw));
        }
      }
    }
  }
}

namespace {
// A device copy of host values, and the values of a device buffer back on the host.
template <class T>
sw::Buffer to_dev(const std::vector<T>& h) {
  sw::Buffer b(std::max<size_t>(h.size(), 1) * sizeof(T), sw::Mem::Activations, sw::Device::sim(0));
  sw::copy_bytes(b.data(), sw::Device::sim(0), h.data(), sw::Device::cpu(), h.size() * sizeof(T));
  return b;
}
template <class T>
std::vector<T> to_host(const sw::Buffer& b, size_t n) {
  std::vector<T> h(n);
  sw::copy_bytes(h.data(), sw::Device::cpu(), b.data(), sw::Device::sim(0), n * sizeof(T));
  return h;
}
}  // namespace

TEST_CASE("tp ops: the simulated device forwards them: the CPU's bits from device memory (BF16)") {
  const int B = 2, T = 7, N = B * T + 600, C = 24, Vt = 60;
  const int64_t lo = 21;
  const int V = 25;
  const auto& cpu16 = cpu(DType::BF16);
  const auto& sim = sw::ops_for(sw::Device::sim(0), DType::BF16);
  const Vec h = randv((size_t)N * C, 31), w = round_bf16(randv((size_t)V * C, 32, 0.5f));
  const std::vector<uint16_t> w16 = to_bf16(w);
  const Vec wpe = randv((size_t)T * C, 33), dout = randv((size_t)N * C, 34);
  const std::vector<int32_t> tg = rand_ids(N, Vt, 35, 5);
  sw::Buffer dh_ = to_dev(h), dw_ = to_dev(w), dw16 = to_dev(w16), dwpe = to_dev(wpe),
             ddout = to_dev(dout), dtg = to_dev(tg);
  const sw::Operand wd(dw_.f32(), reinterpret_cast<const uint16_t*>(dw16.data()));  // both forms
  const int32_t* tgd = reinterpret_cast<const int32_t*>(dtg.data());

  // Embedding and positions.
  Vec out((size_t)N * C), gt((size_t)V * C, 0.f), gp((size_t)T * C, 0.f);
  cpu16.vocab_embedding_forward(out.data(), tg.data(), w16.data(), lo, N, C, V);
  cpu16.position_forward(out.data(), wpe.data(), 3, N, T, C);
  cpu16.vocab_embedding_backward(gt.data(), dout.data(), tg.data(), lo, N, C, V);
  cpu16.position_backward(gp.data(), dout.data(), 3, N, T, C);
  sw::Buffer dout_ = to_dev(Vec(out.size())), dgt = to_dev(Vec(gt.size(), 0.f)),
             dgp = to_dev(Vec(gp.size(), 0.f));
  sim.vocab_embedding_forward(dout_.f32(), tgd, wd, lo, N, C, V);
  sim.position_forward(dout_.f32(), dwpe.f32(), 3, N, T, C);
  sim.vocab_embedding_backward(dgt.f32(), ddout.f32(), tgd, lo, N, C, V);
  sim.position_backward(dgp.f32(), ddout.f32(), 3, N, T, C);
  REQUIRE(same_bits(to_host<float>(dout_, out.size()), out));
  REQUIRE(same_bits(to_host<float>(dgt, gt.size()), gt));
  REQUIRE(same_bits(to_host<float>(dgp, gp.size()), gp));

  // Cross-entropy: stats of this shard and a made-up second one, combine, backward.
  Vec st((size_t)2 * N * 3), lse(N), loss(N), gh((size_t)N * C, 0.f), gw((size_t)V * C);
  cpu16.xent_shard_stats(st.data(), h.data(), w.data(), tg.data(), lo, N, C, V);
  for (int n = 0; n < N; ++n)
    st[(size_t)(N + n) * 3] = 1.f, st[(size_t)(N + n) * 3 + 1] = 30.f, st[(size_t)(N + n) * 3 + 2] = 0.f;
  Vec st_half(st.begin(), st.begin() + (size_t)N * 3);
  double total = 0;
  cpu16.xent_shard_combine(&total, lse.data(), loss.data(), st.data(), tg.data(), 2, N);
  cpu16.xent_shard_backward(gh.data(), sw::GradOut(gw.data(), true), h.data(), w.data(), lse.data(), tg.data(), lo, N, C, V, 0.5f);

  sw::Buffer dst = to_dev(st), dlse = to_dev(Vec(N)), dloss = to_dev(Vec(N)),
             dtotal = to_dev(std::vector<double>{0.0}), dgh = to_dev(Vec(gh.size(), 0.f)),
             dgw = to_dev(Vec(gw.size(), std::numeric_limits<float>::quiet_NaN()));
  sim.xent_shard_stats(dst.f32(), dh_.f32(), wd, tgd, lo, N, C, V);  // over the first rank's
  REQUIRE(same_bits(to_host<float>(dst, (size_t)N * 3), st_half));
  sim.xent_shard_combine(reinterpret_cast<double*>(dtotal.data()), dlse.f32(), dloss.f32(), dst.f32(), tgd, 2, N);
  sim.xent_shard_backward(dgh.f32(), sw::GradOut(dgw.f32(), true), dh_.f32(), wd, dlse.f32(), tgd, lo, N, C, V, 0.5f);
  REQUIRE(to_host<double>(dtotal, 1)[0] == total);
  REQUIRE(same_bits(to_host<float>(dlse, N), lse));
  REQUIRE(same_bits(to_host<float>(dloss, N), loss));
  REQUIRE(same_bits(to_host<float>(dgh, gh.size()), gh));
  REQUIRE(same_bits(to_host<float>(dgw, gw.size()), gw));
}
