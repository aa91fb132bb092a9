// CPU kernels A: embedding, LayerNorm, RMSNorm, GELU, SwiGLU, residual and vector utilities,
// RoPE, AdamW.
//
// For every op: forward against a naive double-precision reference written here; every backward
// against central finite differences of L = dot(out, R) with random R (tests/common/gradcheck.h);
// the "+=" rule (two backward calls from zero give exactly twice one call); bit-identical results
// on repeated calls and across thread counts (1, 2, 3); odd sizes (C not a multiple of 16, N = 1)
// and sizes large enough to take the multi-threaded paths.
//
// Finite-difference tolerances. check_grad perturbs one input by h = 1e-2 and the loss changes
// only through the fp32 outputs that depend on it. Two error sources:
//  * rounding: those outputs carry ~1e-7 relative error each, so the loss difference carries
//    ~1e-7 * sqrt(#outputs touched) absolute error, divided by 2h = 0.02: ~1e-5 here;
//  * truncation: h^2/6 * |f'''|, ~2e-5 for the smooth ops below with O(1) inputs.
// Against gradients of size O(1) (floor 1e-2) that is ~1e-3 normalised error at worst; each op's
// tolerance below is set a few times above the error measured when the test was written, and far
// below what a wrong formula gives (a missing term or a wrong sign shows up as O(0.1..1)).
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/env.h"
#include "kernels/cpu/cpu_kernels.h"
#include "tests/common/gradcheck.h"

namespace {

using swtest::check_grad;
using swtest::dot;
using Vec = std::vector<float>;

Vec randv(size_t n, uint64_t seed, float stddev = 1.f) {
  Vec v(n);
  swtest::randn(v, seed, stddev);
  return v;
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs fn with the OpenMP pool set to nt threads, restoring the previous setting.
template <class F>
void with_threads(int nt, F&& fn) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(nt);
  fn();
  omp_set_num_threads(prev);
}

// Normalised max error of a vs the double reference: |a - r| / max(|r|, floor).
double max_rel_err(const float* a, const double* r, size_t n, double floor) {
  double e = 0;
  for (size_t i = 0; i < n; ++i) e = std::max(e, std::fabs(a[i] - r[i]) / std::max(std::fabs(r[i]), floor));
  return e;
}

void check_fd(const char* what, const std::function<double()>& loss, Vec& x, const Vec& analytic,
              double tol, float h = 1e-2f, double floor = 1e-2) {
  const swtest::GradCheck r = check_grad(loss, x.data(), analytic.data(), x.size(), 64, h, floor);
  INFO(what << ": " << r.str());
  if (sw::env_flag("SHARDWISE_TEST_VERBOSE")) WARN(what << ": " << r.str());
  CHECK(r.max_err < tol);
}

// g2 must be exactly 2 * g1 (two backward calls from zero vs one).
void check_doubled(const char* what, const Vec& g1, const Vec& g2) {
  size_t bad = 0;
  for (size_t i = 0; i < g1.size(); ++i) bad += g2[i] != 2.f * g1[i];
  INFO(what << ": " << bad << " of " << g1.size() << " elements are not exactly doubled");
  CHECK(bad == 0);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST_CASE("kernels_a embedding forward and backward", "[embedding]") {
  struct Shape { int B, T, C, V; bool pos; };
  // V small relative to B*T: tokens repeat; (4,64,100) takes the multi-threaded path.
  const Shape shapes[] = {{2, 5, 37, 7, true}, {1, 1, 16, 3, true}, {3, 4, 20, 5, false},
                          {4, 64, 100, 11, true}};
  for (const Shape& s : shapes) {
    CAPTURE(s.B, s.T, s.C, s.V, s.pos);
    const int BT = s.B * s.T;
    std::vector<int32_t> tok(BT);
    for (int n = 0; n < BT; ++n) tok[n] = static_cast<int32_t>((n * 7 + n / 3) % s.V);
    tok[0] = tok[BT - 1];  // at least one repeat even for tiny shapes
    Vec wte = randv(size_t(s.V) * s.C, 1), wpe = randv(size_t(s.T) * s.C, 2);
    const float* wpe_p = s.pos ? wpe.data() : nullptr;
    Vec out(size_t(BT) * s.C);
    sw::cpu::embedding_forward(out.data(), tok.data(), wte.data(), wpe_p, s.B, s.T, s.C);
    // Forward: the sum is exact in fp32 (one addition, same as the reference).
    size_t bad = 0;
    for (int n = 0; n < BT; ++n)
      for (int c = 0; c < s.C; ++c) {
        const float ref = wte[size_t(tok[n]) * s.C + c] + (s.pos ? wpe[size_t(n % s.T) * s.C + c] : 0.f);
        bad += out[size_t(n) * s.C + c] != ref;
      }
    CHECK(bad == 0);

    // Backward against a double reference (tight) and finite differences (independent).
    const Vec R = randv(out.size(), 3);
    Vec dwte(wte.size(), 0.f), dwpe(wpe.size(), 0.f);
    sw::cpu::embedding_backward(dwte.data(), s.pos ? dwpe.data() : nullptr, R.data(), tok.data(),
                                s.B, s.T, s.C);
    std::vector<double> rte(wte.size(), 0.0), rpe(wpe.size(), 0.0);
    for (int n = 0; n < BT; ++n)
      for (int c = 0; c < s.C; ++c) {
        rte[size_t(tok[n]) * s.C + c] += R[size_t(n) * s.C + c];
        rpe[size_t(n % s.T) * s.C + c] += R[size_t(n) * s.C + c];
      }
    // Repeated tokens sum up to B*T fp32 values of size ~1: relative error ~BT * 6e-8.
    CHECK(max_rel_err(dwte.data(), rte.data(), rte.size(), 1.0) < 2e-5);
    if (s.pos) CHECK(max_rel_err(dwpe.data(), rpe.data(), rpe.size(), 1.0) < 2e-5);
    else CHECK(std::all_of(dwpe.begin(), dwpe.end(), [](float v) { return v == 0.f; }));

    auto loss = [&] {
      sw::cpu::embedding_forward(out.data(), tok.data(), wte.data(), wpe_p, s.B, s.T, s.C);
      return dot(out.data(), R.data(), out.size());
    };
    // Linear in wte/wpe: the finite difference has no truncation error, only rounding (1e-5).
    check_fd("dwte", loss, wte, dwte, 1e-3);
    if (s.pos) check_fd("dwpe", loss, wpe, dwpe, 1e-3);

    // "+=": a second call adds the same contributions. With repeated tokens the sums are
    // re-associated ((S + a1) + a2 vs 2(a1 + a2)), so doubling holds to rounding, not bit-exactly.
    Vec dwte2 = dwte, dwpe2 = dwpe;
    sw::cpu::embedding_backward(dwte2.data(), s.pos ? dwpe2.data() : nullptr, R.data(), tok.data(),
                                s.B, s.T, s.C);
    for (size_t i = 0; i < dwte.size(); ++i) REQUIRE(dwte2[i] == Approx(2 * dwte[i]).margin(1e-5));
    for (size_t i = 0; i < dwpe.size(); ++i) REQUIRE(dwpe2[i] == Approx(2 * dwpe[i]).margin(1e-5));

    // Bit-identical across thread counts (threads split channels; each element sums rows in order).
    for (int nt : {1, 2, 3}) {
      Vec a(wte.size(), 0.f), b(wpe.size(), 0.f);
      with_threads(nt, [&] {
        sw::cpu::embedding_backward(a.data(), s.pos ? b.data() : nullptr, R.data(), tok.data(), s.B,
                                    s.T, s.C);
      });
      CHECK(same_bits(a, dwte));
      CHECK(same_bits(b, dwpe));
    }
  }
}

// ---------------------------------------------------------------------------------------------
namespace {
void layernorm_ref(std::vector<double>& out, std::vector<double>& mean, std::vector<double>& rstd,
                   const Vec& x, const Vec& w, const Vec* b, int N, int C) {
  out.assign(size_t(N) * C, 0);
  mean.assign(N, 0);
  rstd.assign(N, 0);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int i = 0; i < C; ++i) m += x[size_t(n) * C + i];
    m /= C;
    for (int i = 0; i < C; ++i) v += (x[size_t(n) * C + i] - m) * (x[size_t(n) * C + i] - m);
    v /= C;
    const double r = 1.0 / std::sqrt(v + 1e-5);
    for (int i = 0; i < C; ++i)
      out[size_t(n) * C + i] = (x[size_t(n) * C + i] - m) * r * w[i] + (b ? (*b)[i] : 0.0);
    mean[n] = m;
    rstd[n] = r;
  }
}
}  // namespace

TEST_CASE("kernels_a layernorm forward and backward", "[layernorm]") {
  struct Shape { int N, C; bool bias; };
  const Shape shapes[] = {{5, 37, true}, {1, 16, true}, {3, 24, false}, {130, 200, true}};
  for (const Shape& s : shapes) {
    CAPTURE(s.N, s.C, s.bias);
    const size_t NC = size_t(s.N) * s.C;
    Vec x = randv(NC, 10), w = randv(s.C, 11), b = randv(s.C, 12);
    for (size_t i = 0; i < NC; ++i) x[i] = 0.5f + 2.f * x[i];  // non-zero mean, non-unit variance
    const float* bp = s.bias ? b.data() : nullptr;
    Vec out(NC), mean(s.N), rstd(s.N);
    sw::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bp, s.N, s.C);
    std::vector<double> rout, rmean, rrstd;
    layernorm_ref(rout, rmean, rrstd, x, w, s.bias ? &b : nullptr, s.N, s.C);
    // fp32 row sums of C values and a handful of roundings per output: ~1e-6 relative to the
    // row scale (floor 1: outputs are O(1)).
    CHECK(max_rel_err(out.data(), rout.data(), NC, 1.0) < 2e-6);
    CHECK(max_rel_err(mean.data(), rmean.data(), s.N, 1.0) < 2e-6);
    CHECK(max_rel_err(rstd.data(), rrstd.data(), s.N, 1.0) < 2e-6);
    const Vec out0 = out;  // the finite-difference loss below overwrites out

    const Vec R = randv(NC, 13);
    Vec dx(NC, 0.f), dw(s.C, 0.f), db(s.C, 0.f);
    sw::cpu::layernorm_backward(dx.data(), dw.data(), s.bias ? db.data() : nullptr, R.data(),
                                x.data(), w.data(), mean.data(), rstd.data(), s.N, s.C);
    Vec m2(s.N), r2(s.N);
    auto loss = [&] {
      sw::cpu::layernorm_forward(out.data(), m2.data(), r2.data(), x.data(), w.data(), bp, s.N, s.C);
      return dot(out.data(), R.data(), NC);
    };
    // dinp: moving one x moves the row's fp32 mean and variance, whose rounding (~1e-6) shifts
    // all C outputs coherently: ~2e-4 absolute noise on the difference quotient at h = 2e-2.
    // So h = 2e-2 and a floor of 0.1 (typical |dinp| here is 0.3..1); measured worst 1.8e-3.
    // dw, db: linear in w and b, no truncation error; measured worst 8e-5.
    check_fd("dinp", loss, x, dx, 6e-3, 2e-2f, 0.1);
    check_fd("dw", loss, w, dw, 1e-3);
    if (s.bias) check_fd("db", loss, b, db, 1e-3);
    else CHECK(std::all_of(db.begin(), db.end(), [](float v) { return v == 0.f; }));

    // "+=": exactly doubled (each call adds the same values computed the same way).
    Vec dx2 = dx, dw2 = dw, db2 = db;
    sw::cpu::layernorm_backward(dx2.data(), dw2.data(), s.bias ? db2.data() : nullptr, R.data(),
                                x.data(), w.data(), mean.data(), rstd.data(), s.N, s.C);
    check_doubled("dinp", dx, dx2);
    check_doubled("dw", dw, dw2);
    check_doubled("db", db, db2);

    // Bit-identical across repeated calls and thread counts.
    for (int nt : {1, 2, 3}) {
      Vec o(NC), a(NC, 0.f), c(s.C, 0.f), d(s.C, 0.f);
      with_threads(nt, [&] {
        sw::cpu::layernorm_forward(o.data(), m2.data(), r2.data(), x.data(), w.data(), bp, s.N, s.C);
        sw::cpu::layernorm_backward(a.data(), c.data(), d.data(), R.data(), x.data(), w.data(),
                                    mean.data(), rstd.data(), s.N, s.C);
      });
      CHECK(same_bits(o, out0));
      CHECK(same_bits(a, dx));
      CHECK(same_bits(c, dw));
      if (s.bias) CHECK(same_bits(d, db));
    }
  }
}

TEST_CASE("kernels_a norms on an empty batch", "[layernorm][rmsnorm]") {
  Vec dw(4, 1.f), db(4, 1.f);
  sw::cpu::layernorm_forward(nullptr, nullptr, nullptr, nullptr, dw.data(), db.data(), 0, 4);
  sw::cpu::layernorm_backward(nullptr, dw.data(), db.data(), nullptr, nullptr, dw.data(), nullptr,
                              nullptr, 0, 4);
  sw::cpu::rmsnorm_backward(nullptr, dw.data(), nullptr, nullptr, dw.data(), nullptr, 0, 4);
  CHECK(dw == Vec(4, 1.f));
  CHECK(db == Vec(4, 1.f));
}

TEST_CASE("kernels_a rmsnorm forward and backward", "[rmsnorm]") {
  struct Shape { int N, C; float eps; };
  const Shape shapes[] = {{5, 37, 1e-5f}, {1, 16, 1e-6f}, {130, 200, 1e-5f}};
  for (const Shape& s : shapes) {
    CAPTURE(s.N, s.C, s.eps);
    const size_t NC = size_t(s.N) * s.C;
    Vec x = randv(NC, 20), w = randv(s.C, 21);
    for (size_t i = 0; i < NC; ++i) x[i] = 0.3f + 1.5f * x[i];
    Vec out(NC), rstd(s.N);
    sw::cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), s.N, s.C, s.eps);
    std::vector<double> rout(NC), rr(s.N);
    for (int n = 0; n < s.N; ++n) {
      double ss = 0;
      for (int i = 0; i < s.C; ++i) ss += double(x[size_t(n) * s.C + i]) * x[size_t(n) * s.C + i];
      rr[n] = 1.0 / std::sqrt(ss / s.C + s.eps);
      for (int i = 0; i < s.C; ++i) rout[size_t(n) * s.C + i] = x[size_t(n) * s.C + i] * rr[n] * w[i];
    }
    CHECK(max_rel_err(out.data(), rout.data(), NC, 1.0) < 2e-6);
    CHECK(max_rel_err(rstd.data(), rr.data(), s.N, 1.0) < 2e-6);
    const Vec out0 = out;  // the finite-difference loss below overwrites out

    const Vec R = randv(NC, 22);
    Vec dx(NC, 0.f), dw(s.C, 0.f);
    sw::cpu::rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), s.N, s.C);
    Vec r2(s.N);
    auto loss = [&] {
      sw::cpu::rmsnorm_forward(out.data(), r2.data(), x.data(), w.data(), s.N, s.C, s.eps);
      return dot(out.data(), R.data(), NC);
    };
    // Same noise model as LayerNorm's dinp (the row's fp32 rstd is shared by all outputs).
    check_fd("dinp", loss, x, dx, 6e-3, 2e-2f, 0.1);
    check_fd("dw", loss, w, dw, 1e-3);

    Vec dx2 = dx, dw2 = dw;
    sw::cpu::rmsnorm_backward(dx2.data(), dw2.data(), R.data(), x.data(), w.data(), rstd.data(), s.N, s.C);
    check_doubled("dinp", dx, dx2);
    check_doubled("dw", dw, dw2);

    for (int nt : {1, 2, 3}) {
      Vec o(NC), a(NC, 0.f), c(s.C, 0.f);
      with_threads(nt, [&] {
        sw::cpu::rmsnorm_forward(o.data(), r2.data(), x.data(), w.data(), s.N, s.C, s.eps);
        sw::cpu::rmsnorm_backward(a.data(), c.data(), R.data(), x.data(), w.data(), rstd.data(), s.N, s.C);
      });
      CHECK(same_bits(o, out0));
      CHECK(same_bits(a, dx));
      CHECK(same_bits(c, dw));
    }
  }
}

// ---------------------------------------------------------------------------------------------
namespace {
// GELU's tanh formula in double. 1 + tanh(u) is evaluated as 2 e^{2u} / (1 + e^{2u}) for
// u < -5, where 1 + tanh(u) < 1e-4 would lose digits to cancellation even in double.
double gelu_u(double x) { return std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x); }
double one_plus_tanh(double u) {
  return u < -5 ? 2 * std::exp(2 * u) / (1 + std::exp(2 * u)) : 1 + std::tanh(u);
}
double gelu_ref(double x) { return 0.5 * x * one_plus_tanh(gelu_u(x)); }
double gelu_grad_ref(double x) {
  const double opt = one_plus_tanh(gelu_u(x)), omt = 2 - opt;  // 1 + tanh, 1 - tanh
  return 0.5 * opt + 0.5 * x * opt * omt * std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
}
}  // namespace

TEST_CASE("kernels_a gelu forward and backward", "[gelu]") {
  // A dense sweep of [-12, 12], large enough to take the parallel path, plus extremes.
  Vec x;
  for (int i = -600000; i <= 600000; i += 7) x.push_back(i * 2e-5f);
  const size_t nsweep = x.size();
  for (float v : {30.f, -30.f, 1e4f, -1e4f, 3e38f, -3e38f}) x.push_back(v);
  const size_t n = x.size();
  Vec y(n), dy(n, 0.f);
  const Vec g = randv(n, 30);
  sw::cpu::gelu_forward(y.data(), x.data(), n);
  sw::cpu::gelu_backward(dy.data(), x.data(), g.data(), n);
  // Error model. The kernel computes y = x * sigmoid(2u) with a ~2-ulp exp: ~3e-7 relative error
  // while |u| is small. For negative x the fp32 rounding of u itself (~2 ulp) becomes a relative
  // error of |2u| * 1.2e-7 in e^{-2u}, hence in y: GELU is ill-conditioned there (at x = -4,
  // |2u| = 9.5), and no fp32 evaluation of u avoids it (fp32 tanh-form GELU, as in PyTorch, is
  // worse: its 1 + tanh(u) loses ~|2u| digits of 1e-7 absolutely). So the bound is
  // 1e-6 * max(1, |u|) relative (measured worst: 1.5e-6 at x = -3.7 where |u| = 4.8, and < 3e-7
  // for x > -1). The derivative crosses zero at x ~ -0.75: there the error is measured against
  // a floor of 0.1 (the derivative's scale; measured abs error there 7e-8). The kernel clamps
  // e^{-2u} to e^80 (x < -9.3), keeping every intermediate a normal float: there it returns
  // ~x * 2e-35 for a true value below that, so only the size is checked.
  double worst = 0, worst_x = 0;
  size_t tail_bad = 0;
  for (size_t i = 0; i < nsweep; ++i) {
    if (2 * gelu_u(x[i]) < -80) {
      tail_bad += !(std::fabs(y[i]) <= 2e-35f * std::fabs(x[i]));
      tail_bad += !(std::fabs(dy[i]) <= 1e-30f * std::fabs(g[i]));
      continue;
    }
    const double rf = gelu_ref(x[i]), rb = gelu_grad_ref(x[i]) * g[i];
    const double bound = 1e-6 * std::max(1.0, std::fabs(gelu_u(x[i])));
    const double ef = std::fabs(y[i] - rf) / std::max(std::fabs(rf), 1e-30) / bound;
    const double eb = std::fabs(dy[i] - rb) / std::max(std::fabs(rb), 0.1 * std::fabs(g[i])) / bound;
    if (std::max(ef, eb) > worst) worst = std::max(ef, eb), worst_x = x[i];
  }
  INFO("worst error / bound = " << worst << " at x = " << worst_x);
  if (sw::env_flag("SHARDWISE_TEST_VERBOSE")) WARN("gelu worst error / bound = " << worst << " at x = " << worst_x);
  CHECK(worst < 1.0);
  CHECK(tail_bad == 0);
  // Extremes: identity / zero exactly where the sigmoid saturates; never inf or NaN.
  for (size_t i = nsweep; i < n; ++i) {
    CAPTURE(x[i]);
    if (x[i] > 0) {
      CHECK(y[i] == x[i]);
      CHECK(dy[i] == g[i]);
    } else {
      CHECK(std::fabs(y[i]) <= 1e-30f * std::fabs(x[i]));
      CHECK(std::fabs(dy[i]) <= 1e-30f);
    }
  }

  // Finite differences on a small vector, and the "+=" rule.
  Vec xs = randv(41, 31, 2.f), ys(41);
  const Vec R = randv(41, 32);
  Vec dxs(41, 0.f);
  sw::cpu::gelu_backward(dxs.data(), xs.data(), R.data(), 41);
  auto loss = [&] {
    sw::cpu::gelu_forward(ys.data(), xs.data(), 41);
    return dot(ys.data(), R.data(), 41);
  };
  check_fd("dinp", loss, xs, dxs, 2e-3);
  Vec dxs2 = dxs;
  sw::cpu::gelu_backward(dxs2.data(), xs.data(), R.data(), 41);
  check_doubled("dinp", dxs, dxs2);

  // Elementwise: identical for any thread count.
  for (int nt : {1, 3}) {
    Vec y2(n), d2(n, 0.f);
    with_threads(nt, [&] {
      sw::cpu::gelu_forward(y2.data(), x.data(), n);
      sw::cpu::gelu_backward(d2.data(), x.data(), g.data(), n);
    });
    CHECK(same_bits(y2, y));
    CHECK(same_bits(d2, dy));
  }
}

TEST_CASE("kernels_a swiglu forward and backward", "[swiglu]") {
  struct Shape { int N, F; };
  for (const Shape s : {Shape{3, 37}, Shape{1, 16}, Shape{64, 300}}) {
    CAPTURE(s.N, s.F);
    const size_t NF = size_t(s.N) * s.F;
    Vec gu = randv(2 * NF, 40, 2.f), out(NF);
    sw::cpu::swiglu_forward(out.data(), gu.data(), s.N, s.F);
    std::vector<double> ref(NF);
    for (int n = 0; n < s.N; ++n)
      for (int i = 0; i < s.F; ++i) {
        const double g = gu[size_t(n) * 2 * s.F + i], u = gu[size_t(n) * 2 * s.F + s.F + i];
        ref[size_t(n) * s.F + i] = g / (1.0 + std::exp(-g)) * u;
      }
    // exp (~2 ulp), one division, two products: ~5e-7 relative; inputs |g| < 10 here.
    CHECK(max_rel_err(out.data(), ref.data(), NF, 1e-6) < 1e-6);
    const Vec out0 = out;  // the finite-difference loss below overwrites out

    const Vec R = randv(NF, 41);
    Vec dgu(2 * NF, 0.f);
    sw::cpu::swiglu_backward(dgu.data(), R.data(), gu.data(), s.N, s.F);
    auto loss = [&] {
      sw::cpu::swiglu_forward(out.data(), gu.data(), s.N, s.F);
      return dot(out.data(), R.data(), NF);
    };
    // Samples land on gate and up halves alike; the up half is linear (error ~1e-5).
    check_fd("dgu", loss, gu, dgu, 2e-3);
    Vec dgu2 = dgu;
    sw::cpu::swiglu_backward(dgu2.data(), R.data(), gu.data(), s.N, s.F);
    check_doubled("dgu", dgu, dgu2);
    for (int nt : {1, 3}) {
      Vec o(NF), d(2 * NF, 0.f);
      with_threads(nt, [&] {
        sw::cpu::swiglu_forward(o.data(), gu.data(), s.N, s.F);
        sw::cpu::swiglu_backward(d.data(), R.data(), gu.data(), s.N, s.F);
      });
      CHECK(same_bits(o, out0));
      CHECK(same_bits(d, dgu));
    }
  }
}

// ---------------------------------------------------------------------------------------------
TEST_CASE("kernels_a residual and vector utilities", "[elementwise]") {
  for (size_t n : {size_t{1}, size_t{37}, size_t{100003}}) {
    CAPTURE(n);
    const Vec a = randv(n, 50), b = randv(n, 51);
    // residual: exact fp32 sums, also in place on either operand.
    Vec out(n);
    sw::cpu::residual_forward(out.data(), a.data(), b.data(), n);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += out[i] != a[i] + b[i];
    CHECK(bad == 0);
    Vec a2 = a, b2 = b;
    sw::cpu::residual_forward(a2.data(), a2.data(), b.data(), n);
    sw::cpu::residual_forward(b2.data(), a.data(), b2.data(), n);
    CHECK(same_bits(a2, out));
    CHECK(same_bits(b2, out));

    // add_inplace, scale, fill, copy: exact.
    Vec y = a;
    sw::cpu::add_inplace(y.data(), b.data(), n);
    CHECK(same_bits(y, out));
    sw::cpu::scale(y.data(), 0.5f, n);
    bad = 0;
    for (size_t i = 0; i < n; ++i) bad += y[i] != out[i] * 0.5f;
    CHECK(bad == 0);
    sw::cpu::fill(y.data(), -3.25f, n);
    CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == -3.25f; }));
    sw::cpu::copy(y.data(), a.data(), n);
    CHECK(same_bits(y, a));

    // sum_squares: double accumulation vs a long-double sequential sum; thread-count independent.
    long double ref = 0;
    for (size_t i = 0; i < n; ++i) ref += static_cast<long double>(a[i]) * a[i];
    const double ss = sw::cpu::sum_squares(a.data(), n);
    CHECK(std::fabs(ss - double(ref)) <= 1e-12 * double(ref));
    for (int nt : {1, 3}) {
      double s2 = 0;
      with_threads(nt, [&] { s2 = sw::cpu::sum_squares(a.data(), n); });
      CHECK(std::memcmp(&s2, &ss, sizeof(double)) == 0);
    }
  }
  // Large enough for several sum_squares chunks.
  const size_t big = (size_t{1} << 18) + 12345;
  const Vec v = randv(big, 52);
  long double ref = 0;
  for (float f : v) ref += static_cast<long double>(f) * f;
  const double ss = sw::cpu::sum_squares(v.data(), big);
  CHECK(std::fabs(ss - double(ref)) <= 1e-12 * double(ref));
  for (int nt : {1, 2, 3}) {
    double s2 = 0;
    with_threads(nt, [&] { s2 = sw::cpu::sum_squares(v.data(), big); });
    CHECK(std::memcmp(&s2, &ss, sizeof(double)) == 0);
  }
}

// ---------------------------------------------------------------------------------------------
namespace {
// Hugging Face rotate_half, in double with the exact angle t * theta^(-2i/hd).
void rope_ref(std::vector<double>& y, const Vec& x, int B, int T, int H, int KVH, int hd,
              double theta) {
  y.assign(x.begin(), x.end());
  const int half = hd / 2, row = (H + 2 * KVH) * hd;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H + KVH; ++h) {
        const size_t base = (size_t(b) * T + t) * row + size_t(h) * hd;
        for (int i = 0; i < half; ++i) {
          const double ang = t * std::pow(theta, -2.0 * i / hd);
          const double x1 = x[base + i], x2 = x[base + i + half];
          y[base + i] = x1 * std::cos(ang) - x2 * std::sin(ang);
          y[base + i + half] = x2 * std::cos(ang) + x1 * std::sin(ang);
        }
      }
}
}  // namespace

TEST_CASE("kernels_a rope forward and inverse", "[rope]") {
  struct Shape { int B, T, H, KVH, hd; float theta; };
  const Shape shapes[] = {{2, 7, 3, 1, 8, 10000.f}, {1, 1, 2, 2, 4, 10000.f},
                          {2, 37, 4, 2, 18, 500000.f}, {2, 64, 4, 4, 64, 10000.f}};
  for (const Shape& s : shapes) {
    CAPTURE(s.B, s.T, s.H, s.KVH, s.hd, s.theta);
    const int row = (s.H + 2 * s.KVH) * s.hd;
    const size_t n = size_t(s.B) * s.T * row;
    const Vec x = randv(n, 60);
    Vec y = x;
    sw::cpu::rope_forward(y.data(), s.B, s.T, s.H, s.KVH, s.hd, s.theta);
    std::vector<double> ref;
    rope_ref(ref, x, s.B, s.T, s.H, s.KVH, s.hd, s.theta);
    // The kernel rounds the angle to fp32 like transformers does (|error| <= T * 6e-8 rad), then
    // 2 products + 1 sum: |error| ~ (T * 6e-8 + 3e-7) * |x| with |x| ~ 4 at worst.
    CHECK(max_rel_err(y.data(), ref.data(), n, 1.0) < 4.0 * (s.T * 6e-8 + 3e-7));

    // Position 0 unchanged and v untouched: exactly.
    size_t bad = 0;
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < s.T; ++t)
        for (int j = 0; j < row; ++j) {
          const size_t k = (size_t(b) * s.T + t) * row + j;
          if (t == 0 || j >= (s.H + s.KVH) * s.hd) bad += y[k] != x[k];
        }
    CHECK(bad == 0);

    // backward(forward(x)) == x to rounding (an orthogonal rotation and its transpose).
    Vec z = y;
    sw::cpu::rope_backward(z.data(), s.B, s.T, s.H, s.KVH, s.hd, s.theta);
    double worst = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::fabs(z[i] - x[i])));
    CHECK(worst < 2e-6);

    // Backward against finite differences of dot(rope(x), R): rope is linear, so only rounding.
    // The backward transforms the gradient in place (no "+=": it maps dy to dx).
    const Vec R = randv(n, 61);
    Vec dx = R;
    sw::cpu::rope_backward(dx.data(), s.B, s.T, s.H, s.KVH, s.hd, s.theta);
    Vec xp = x, yp(n);
    auto loss = [&] {
      yp = xp;
      sw::cpu::rope_forward(yp.data(), s.B, s.T, s.H, s.KVH, s.hd, s.theta);
      return dot(yp.data(), R.data(), n);
    };
    check_fd("dqkv", loss, xp, dx, 1e-3);

    for (int nt : {1, 3}) {
      Vec y2 = x;
      with_threads(nt, [&] { sw::cpu::rope_forward(y2.data(), s.B, s.T, s.H, s.KVH, s.hd, s.theta); });
      CHECK(same_bits(y2, y));
    }
  }
  // A table cached for a long T serves a shorter T; a different theta recomputes it.
  Vec a = randv(2 * 5 * 3 * 8, 62), b = a, c = randv(300 * 3 * 8, 63);
  sw::cpu::rope_forward(a.data(), 2, 5, 1, 1, 8, 10000.f);
  const Vec c0 = c;
  sw::cpu::rope_forward(c.data(), 1, 300, 1, 1, 8, 10000.f);  // grows the cached table
  std::vector<double> cref;
  rope_ref(cref, c0, 1, 300, 1, 1, 8, 10000.0);
  CHECK(max_rel_err(c.data(), cref.data(), c.size(), 1.0) < 4.0 * (300 * 6e-8 + 3e-7));
  sw::cpu::rope_forward(b.data(), 2, 5, 1, 1, 8, 10000.f);
  CHECK(same_bits(a, b));
  Vec d = randv(2 * 5 * 3 * 8, 62);
  sw::cpu::rope_forward(d.data(), 2, 5, 1, 1, 8, 20000.f);
  CHECK(!same_bits(d, a));
}

// ---------------------------------------------------------------------------------------------
TEST_CASE("kernels_a adamw against double reference", "[adamw]") {
  for (float wd : {0.f, 0.1f}) {
    for (size_t n : {size_t{1}, size_t{37}, size_t{70001}}) {
      CAPTURE(wd, n);
      const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, gm = 0.5f;
      Vec p = randv(n, 70), m(n, 0.f), v(n, 0.f);
      std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
      const Vec p0 = p;
      for (int step = 1; step <= 5; ++step) {
        Vec g = randv(n, 71 + step, step == 3 ? 1e-6f : 1.f);  // step 3: tiny grads, eps matters
        sw::cpu::adamw(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step, gm);
        // PyTorch's algorithm (docs of torch.optim.AdamW), in double.
        const double bc1 = 1 - std::pow(double(b1), step), bc2 = 1 - std::pow(double(b2), step);
        for (size_t i = 0; i < n; ++i) {
          const double gi = double(g[i]) * gm;
          rp[i] *= 1 - double(lr) * wd;
          rm[i] = b1 * rm[i] + (1 - double(b1)) * gi;
          rv[i] = b2 * rv[i] + (1 - double(b2)) * gi * gi;
          rp[i] -= lr * (rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + eps);
        }
        if (step == 1) {
          // Bias correction makes the first step lr * g / (|g| + eps) = lr * sign(g) where
          // |g| >> eps (elements with |g * grad_mult| < 1e-3 are skipped), plus the decay.
          size_t bad = 0;
          for (size_t i = 0; i < n; ++i) {
            if (std::fabs(g[i] * gm) < 1e-3f) continue;
            const double expect = p0[i] * (1 - double(lr) * wd) - lr * (g[i] > 0 ? 1 : -1);
            bad += std::fabs(p[i] - expect) > 1e-6 * (1 + std::fabs(expect)) + 1e-4 * lr;
          }
          CHECK(bad == 0);
        }
      }
      // Parameters move by ~lr per step; fp32 rounding of p (|p| ~ 3) is ~2e-7 per step.
      CHECK(max_rel_err(p.data(), rp.data(), n, 1.0) < 2e-6);
      CHECK(max_rel_err(m.data(), rm.data(), n, 1e-2) < 1e-5);
      CHECK(max_rel_err(v.data(), rv.data(), n, 1e-6) < 1e-5);
      // Deterministic / thread-count independent (elementwise).
      Vec p2 = p0, m2(n, 0.f), v2(n, 0.f), p3 = p0, m3(n, 0.f), v3(n, 0.f);
      const Vec g = randv(n, 80);
      with_threads(1, [&] { sw::cpu::adamw(p2.data(), g.data(), m2.data(), v2.data(), n, lr, b1, b2, eps, wd, 1, gm); });
      with_threads(3, [&] { sw::cpu::adamw(p3.data(), g.data(), m3.data(), v3.data(), n, lr, b1, b2, eps, wd, 1, gm); });
      CHECK(same_bits(p2, p3));
      CHECK(same_bits(m2, m3));
      CHECK(same_bits(v2, v3));
    }
  }
}
