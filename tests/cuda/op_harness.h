// Every op of kernels/ops.h, run on two backends with the same inputs and compared (ggml's
// test-backend-ops style). A Backend is any Ops plus the two copies that move bytes between the
// host and that Ops' device (memcpy for the CPU, cuda_copy_to_device / _to_host for CUDA), so
// the same cases check CPU bf16 against CPU fp32 (tests/cuda/test_op_harness.cpp, runs
// everywhere) and CUDA fp32 against CPU fp32 (tests/cuda/test_cuda_ops.cpp, needs a GPU).
//
// A case builds its inputs on the host from a fixed seed, uploads them into fresh device
// buffers, runs forward and/or backward (backward with non-zero initial gradients, so the +=
// convention is checked too), and downloads every buffer the op writes. Inputs that come from
// a forward (LayerNorm's mean/rstd, attention's out/lse) are computed on the host in double,
// so both backends' backward passes see identical inputs.
//
// Metric: NMSE = sum (cand - ref)^2 / sum ref^2 per output buffer (the plain sum of squares
// when the reference is all zeros), against a per-case tolerance: `tol` when both backends
// compute in fp32, `tol_lowp` when the candidate's matrix products round to bf16 (element-wise
// ops and norms stay fp32 on every backend, so theirs stay tight). A non-finite value fails.
// determinism() runs every case twice on one backend and demands bitwise-equal outputs.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "kernels/ops.h"

namespace swtest::harness {

struct Backend {
  std::string name;
  const sw::Ops* ops;
  void (*to_device)(void* dst, const void* src, size_t bytes);
  void (*to_host)(void* dst, const void* src, size_t bytes);
};

inline void host_copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
inline Backend cpu_backend(const sw::Ops& ops, std::string name) {
  return {std::move(name), &ops, host_copy, host_copy};
}

using Vec = std::vector<float>;
using IVec = std::vector<int32_t>;

// The device buffers of one run of one case on one backend (freed with the arena).
class Arena {
 public:
  explicit Arena(const Backend& be) : be_(be) {}
  const sw::Ops& ops() const { return *be_.ops; }
  float* up(const Vec& h) {
    float* p = static_cast<float*>(alloc(h.size() * sizeof(float)));
    be_.to_device(p, h.data(), h.size() * sizeof(float));
    return p;
  }
  int32_t* up(const IVec& h) {
    int32_t* p = static_cast<int32_t*>(alloc(h.size() * sizeof(int32_t)));
    be_.to_device(p, h.data(), h.size() * sizeof(int32_t));
    return p;
  }
  double* up(const std::vector<double>& h) {
    double* p = static_cast<double*>(alloc(h.size() * sizeof(double)));
    be_.to_device(p, h.data(), h.size() * sizeof(double));
    return p;
  }
  // Waits for the backend's stream, then copies n floats back.
  Vec down(const float* p, size_t n) const {
    be_.ops->stream().synchronize();
    Vec h(n);
    be_.to_host(h.data(), p, n * sizeof(float));
    return h;
  }
  std::vector<double> down(const double* p, size_t n) const {
    be_.ops->stream().synchronize();
    std::vector<double> h(n);
    be_.to_host(h.data(), p, n * sizeof(double));
    return h;
  }

 private:
  void* alloc(size_t bytes) {
    bufs_.push_back(std::make_unique<sw::Buffer>(std::max<size_t>(bytes, 64), sw::Mem::Workspace,
                                                 be_.ops->device()));
    return bufs_.back()->data();
  }
  const Backend& be_;
  std::vector<std::unique_ptr<sw::Buffer>> bufs_;
};

struct Output {
  std::string name;
  std::vector<double> v;
};
using Outputs = std::vector<Output>;

inline void put(Outputs& o, std::string name, const Vec& v) {
  o.push_back({std::move(name), std::vector<double>(v.begin(), v.end())});
}

struct OpCase {
  std::string op;    // "op:form", the Ops method and its form under test (all_ops, below)
  std::string name;  // op and its parameters
  double tol;        // NMSE tolerance, fp32 against fp32
  double tol_lowp;   // NMSE tolerance when the candidate's matrix products are bf16
  std::function<Outputs(Arena&)> run;
};

// Every data-carrying op of sw::Ops, and for those that take several forms (kernels/ops.h) each
// form, as "op:form": gemm and linear_forward of fp32 or 16-bit operands (lp), a 16-bit output
// (out16), the residual added (residual); backwards adding into (add) or writing (set) an fp32
// input gradient, or with 16-bit operands (lp), a 16-bit input gradient alone (dinp16), the
// norms' gradient in both forms (both); AdamW with its compute copies; the sums of squares of
// one buffer, of several read on the host, into device memory, of rounded values.
inline const std::vector<std::string>& all_ops() {
  static const std::vector<std::string> ops = {
      "gemm:f32", "gemm:lp", "linear_forward:f32", "linear_forward:lp", "linear_forward:out16",
      "linear_forward:residual", "linear_backward:add", "linear_backward:set",
      "linear_backward:lp", "linear_backward:dinp16", "embedding_forward:f32",
      "embedding_forward:lp", "layernorm_forward:f32", "layernorm_forward:residual",
      "layernorm_forward:out16", "layernorm_forward:residual_out16", "layernorm_backward:f32",
      "layernorm_backward:both", "rmsnorm_forward:f32", "rmsnorm_forward:residual",
      "rmsnorm_forward:out16", "rmsnorm_forward:residual_out16", "rmsnorm_backward:f32",
      "rmsnorm_backward:both", "gelu_forward:f32", "gelu_forward:out16", "gelu_backward:add",
      "gelu_backward:set", "gelu_backward:lp", "swiglu_forward:f32", "swiglu_forward:out16",
      "swiglu_backward:add", "swiglu_backward:set", "swiglu_backward:lp", "rope_forward:f32",
      "rope_forward:out16", "rope_backward:f32", "rope_backward:out16", "attention_forward:f32",
      "attention_forward:lp", "attention_backward:add", "attention_backward:set",
      "attention_backward:lp", "adamw:plain", "adamw:copies", "sgd:momentum", "sgd:nesterov",
      "lamb_prepare", "add_scaled", "sums_of_squares:one",
      "sums_of_squares:host", "sums_of_squares:device", "sums_of_squares:rounded",
      "round_copy:f32", "round_copy:lp", "embedding_backward", "residual_forward", "lmhead_xent",
      "lmhead_xent_into", "scale", "fill", "add_inplace", "copy", "narrow", "widen",
      "add_widened", "round_to", "vocab_embedding_forward:f32", "vocab_embedding_forward:lp",
      "vocab_embedding_backward", "position_forward", "position_backward", "xent_shard_stats",
      "xent_shard_combine", "xent_shard_backward:add", "xent_shard_backward:set",
      "xent_shard_backward:lp"};
  return ops;
}

// ---- Inputs ----------------------------------------------------------------------------------

// splitmix64 + Box-Muller: the same numbers on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  Vec normal(size_t n, float stddev = 1.f, float mean = 0.f) {
    Vec v(n);
    for (size_t i = 0; i < n; ++i) {
      const double u1 = uniform() + 1e-300, u2 = uniform();
      v[i] = mean + stddev * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                                                std::cos(6.283185307179586 * u2));
    }
    return v;
  }
  Vec uniform(size_t n, float lo, float hi) {
    Vec v(n);
    for (auto& x : v) x = lo + (hi - lo) * static_cast<float>(uniform());
    return v;
  }
  IVec ints(size_t n, int lo, int hi) {  // [lo, hi)
    IVec v(n);
    for (auto& x : v) x = lo + static_cast<int32_t>(next() % static_cast<uint64_t>(hi - lo));
    return v;
  }

 private:
  uint64_t s_;
};

// mean / rstd of LayerNorm (mean == null: RMSNorm's rstd) in double, rounded to float.
inline void norm_stats(const Vec& x, int N, int C, float eps, Vec* mean, Vec& rstd) {
  rstd.resize(N);
  if (mean) mean->resize(N);
  for (int n = 0; n < N; ++n) {
    const float* r = x.data() + static_cast<size_t>(n) * C;
    double m = 0, v = 0;
    if (mean) {
      for (int i = 0; i < C; ++i) m += r[i];
      m /= C;
    }
    for (int i = 0; i < C; ++i) v += (r[i] - m) * (r[i] - m);
    if (mean) (*mean)[n] = static_cast<float>(m);
    rstd[n] = static_cast<float>(1.0 / std::sqrt(v / C + eps));
  }
}

// Causal GQA attention in double (out (B,T,H*hd), lse (B,H,T)), the inputs of the backward case.
inline void attention_host(const Vec& qkv, int B, int T, int H, int KVH, int hd, Vec& out,
                           Vec& lse) {
  const size_t R = static_cast<size_t>(H + 2 * KVH) * hd;
  out.assign(static_cast<size_t>(B) * T * H * hd, 0.f);
  lse.assign(static_cast<size_t>(B) * H * T, 0.f);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> s(T), acc(hd);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int g = h / (H / KVH);
      for (int t = 0; t < T; ++t) {
        const float* q = qkv.data() + (static_cast<size_t>(b) * T + t) * R + h * hd;
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          const float* k = qkv.data() + (static_cast<size_t>(b) * T + j) * R + (H + g) * hd;
          double d = 0;
          for (int i = 0; i < hd; ++i) d += double(q[i]) * k[i];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = 0; j <= t; ++j) {
          const double p = std::exp(s[j] - mx);
          sum += p;
          const float* v = qkv.data() + (static_cast<size_t>(b) * T + j) * R + (H + KVH + g) * hd;
          for (int i = 0; i < hd; ++i) acc[i] += p * v[i];
        }
        float* o = out.data() + (static_cast<size_t>(b) * T + t) * H * hd + h * hd;
        for (int i = 0; i < hd; ++i) o[i] = static_cast<float>(acc[i] / sum);
        lse[(static_cast<size_t>(b) * H + h) * T + t] = static_cast<float>(mx + std::log(sum));
      }
    }
}

// n 16-bit values of dtype dt packed two per float (as a backend's narrow writes them), widened
// on the host.
inline Vec widen_packed(const Vec& raw, size_t n, sw::DType dt) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, reinterpret_cast<const char*>(raw.data()) + 2 * i, 2);
    v[i] = dt == sw::DType::BF16 ? sw::bf16_to_f32(h) : sw::f16_to_f32(h);
  }
  return v;
}
// A 16-bit buffer of n values on the backend (floats, two values each), filled with NaN bits.
inline uint16_t* up16(Arena& a, size_t n) {
  return reinterpret_cast<uint16_t*>(a.up(Vec((n + 1) / 2 + 1, NAN)));
}
inline Vec down16(Arena& a, const uint16_t* p, size_t n, sw::DType dt) {
  return widen_packed(a.down(reinterpret_cast<const float*>(p), (n + 1) / 2), n, dt);
}

// Values narrowed to the backend's compute precision (lp) and widened back (wide): a 16-bit
// operand and the fp32 values the fp32 op it is compared with reads.
struct Narrowed16 {
  uint16_t* lp;
  float* wide;
  Narrowed16(Arena& a, const float* p, size_t n) : lp(up16(a, n)), wide(a.up(Vec(n, NAN))) {
    const sw::DType dt = a.ops().compute();
    a.ops().narrow(dt, p, lp, n);
    a.ops().widen(dt, lp, wide, n);
  }
};
// A linear's weight in form wf (0: fp32, 1: 16-bit only, 2: both, as a mixed-precision unit
// hands its weights to the products) and, for the fp32 op it is compared with, the fp32 weight:
// as given for form 0 (the product rounds it), its rounding for the others (the values the
// 16-bit copy holds; the same product).
struct WeightForms {
  sw::Operand operand = nullptr;
  const float* rounded = nullptr;
  WeightForms(Arena& a, const Vec& w, int wf) {
    float* f = a.up(w);
    rounded = f;
    operand = f;
    if (wf == 0) return;
    const sw::DType dt = a.ops().compute();
    uint16_t* w16 = up16(a, w.size());
    a.ops().round_copy_lp(dt, f, w16, f, w.size());
    operand = wf == 1 ? sw::Operand(w16) : sw::Operand(f, w16);
  }
};
// A forward product's operands on the backend, drawn from r in this order (the members'):
// x (fp32, and narrowed to the compute precision), the weight (in form wf: WeightForms), the
// bias (passed only where `bias`).
struct LinearLpInputs {
  const Vec xv, wv, bv;
  const float* x;
  uint16_t* x16;
  const float* b;
  WeightForms w;
  LinearLpInputs(Arena& a, Rng& r, int N, int C, int OC, bool bias, int wf)
      : xv(r.normal(size_t(N) * C)), wv(r.normal(size_t(OC) * C, 0.2f)), bv(r.normal(OC)),
        x(a.up(xv)), x16(up16(a, xv.size())), b(bias ? a.up(bv) : nullptr), w(a, wv, wf) {
    a.ops().narrow(a.ops().compute(), x, x16, xv.size());
  }
};
// A backward product's operands on the backend, drawn from r in this order: x, the weight,
// dout, the starting dw and db; x and dout also narrowed to the compute precision.
struct LinearBackLpInputs {
  const Vec x, w, dy, dw0, db0;
  const float *px, *pdy;
  uint16_t *x16, *dy16;
  LinearBackLpInputs(Arena& a, Rng& r, int N, int C, int OC)
      : x(r.normal(size_t(N) * C)), w(r.normal(size_t(OC) * C, 0.2f)),
        dy(r.normal(size_t(N) * OC)), dw0(r.normal(w.size())), db0(r.normal(OC)), px(a.up(x)),
        pdy(a.up(dy)), x16(up16(a, x.size())), dy16(up16(a, dy.size())) {
    const sw::DType dt = a.ops().compute();
    a.ops().narrow(dt, px, x16, x.size());
    a.ops().narrow(dt, pdy, dy16, dy.size());
  }
};
inline std::string weight_form(int wf) { return wf == 0 ? "w=f32" : wf == 1 ? "w=lp" : "w=both"; }

inline std::string shape(std::initializer_list<std::pair<const char*, long>> kv) {
  std::string s;
  for (const auto& [k, v] : kv) s += std::string(s.empty() ? "" : " ") + k + "=" + std::to_string(v);
  return s;
}

// ---- The cases -------------------------------------------------------------------------------

// Tolerances (NMSE). fp32 vs fp32: different summation orders and exp implementations give
// ~1e-14..1e-12; the limits below leave two orders of magnitude. bf16 operands carry a relative
// error of 2^-9 each, so products land near 1e-6..1e-5.
constexpr double kTolElem = 1e-11;      // element-wise, both fp32 everywhere
constexpr double kTolNorm = 1e-10;      // norms (row reductions in different orders)
constexpr double kTolMat = 1e-9;        // products, fp32
constexpr double kTolMatLowp = 1e-4;    // products, bf16 operands (measured <= 1.1e-5)
constexpr double kTolAttn = 1e-8;       // attention, fp32 (exp + two products per score)
constexpr double kTolAttnLowp = 5e-4;   // attention, bf16 operands (measured <= 5.3e-5)
// Outputs written 16-bit (the out16 forms): two backends' fp32 values an ulp apart round to
// different 16-bit values now and then (~3e-5 of bf16 values, each then off by 2^-8), so
// across backends only this; each backend's lp output is held bitwise to narrow() of its own
// fp32 op by paired_forms_exact.
constexpr double kTolRound16 = 1e-6;

inline std::vector<OpCase> op_cases() {
  std::vector<OpCase> cs;
  uint64_t seed = 1;

  // gemm: all four transpositions, padded leading dimensions, beta 0 and non-zero; K = 0 (an
  // empty sum: C = beta C, zeros with beta 0).
  struct G { int M, N, K; float alpha, beta; };
  for (const G g : {G{37, 29, 53, 0.7f, 0.3f}, G{1, 67, 19, 1.f, 0.f}, G{33, 1, 1, -1.f, 1.f},
                    G{9, 7, 0, 1.f, 0.5f}, G{9, 7, 0, 1.f, 0.f}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const uint64_t sd = seed++;
        cs.push_back({"gemm:f32",
                      "gemm[f32] " +
                          shape({{"ta", ta}, {"tb", tb}, {"M", g.M}, {"N", g.N}, {"K", g.K}}) +
                          " beta=" + std::to_string(g.beta),
                      kTolMat, kTolMatLowp, [g, ta, tb, sd](Arena& a) {
                        Rng r(sd);
                        const int lda = (ta ? g.M : g.K) + 3, ldb = (tb ? g.K : g.N) + 2,
                                  ldc = g.N + 5;
                        const Vec A = r.normal(size_t(ta ? g.K : g.M) * lda);
                        const Vec B = r.normal(size_t(tb ? g.N : g.K) * ldb);
                        const Vec C0 = r.normal(size_t(g.M) * ldc);
                        float* c = a.up(C0);
                        a.ops().gemm(ta, tb, g.M, g.N, g.K, g.alpha, a.up(A), lda, a.up(B), ldb,
                                     g.beta, c, ldc);
                        Outputs o;
                        put(o, "C", a.down(c, C0.size()));
                        return o;
                      }});
      }

  // gemm with A, B or both 16-bit, against gemm on the fp32 values: with dense operands (the
  // layout gemm's own narrowed copies have) bit for bit ("lp" / "ref"); with padded leading
  // dimensions the same products, which cuBLAS may order differently by alignment, so only
  // against the other backend ("C").
  for (int which = 1; which < 4; ++which)
    for (int ta = 0; ta < 2; ++ta)
      for (int pad = 0; pad < 2; ++pad) {
      const uint64_t sd = seed++;
      const G g{37, 29, 53, 0.7f, 0.3f};
      cs.push_back({"gemm:lp",
                    "gemm[lp] " + shape({{"ta", ta}, {"lpA", which & 1}, {"lpB", which >> 1},
                                        {"padded", pad}}),
                    kTolMat, kTolMatLowp, [g, ta, which, pad, sd](Arena& a) {
                      Outputs o;
                      const sw::DType dt = a.ops().compute();
                      if (dt == sw::DType::F32) return o;
                      const int tb = 1 - ta;
                      Rng r(sd);
                      const int lda = (ta ? g.M : g.K) + 3 * pad, ldb = (tb ? g.K : g.N) + 2 * pad,
                                ldc = g.N + 5;
                      const size_t na = size_t(ta ? g.K : g.M) * lda,
                                   nb = size_t(tb ? g.N : g.K) * ldb;
                      const Vec C0 = r.normal(size_t(g.M) * ldc);
                      const float* A = a.up(r.normal(na));
                      const float* B = a.up(r.normal(nb));
                      uint16_t* A16 = up16(a, na);
                      uint16_t* B16 = up16(a, nb);
                      a.ops().narrow(dt, A, A16, na);
                      a.ops().narrow(dt, B, B16, nb);
                      float *c = a.up(C0), *cr = a.up(C0);
                      const sw::Operand oa = which & 1 ? sw::Operand(A16) : sw::Operand(A);
                      const sw::Operand ob = which & 2 ? sw::Operand(B16) : sw::Operand(B);
                      a.ops().gemm(ta, tb, g.M, g.N, g.K, g.alpha, oa, lda, ob, ldb, g.beta, c,
                                   ldc);
                      if (pad) {
                        put(o, "C", a.down(c, C0.size()));
                        return o;
                      }
                      a.ops().gemm(ta, tb, g.M, g.N, g.K, g.alpha, A, lda, B, ldb, g.beta, cr, ldc);
                      put(o, "lp", a.down(c, C0.size()));
                      put(o, "ref", a.down(cr, C0.size()));
                      return o;
                    }});
    }

  // linear forward / backward (accumulating; dinp and db may be null).
  struct L { int N, C, OC; bool bias; };
  for (const L l : {L{37, 45, 29, true}, L{1, 64, 3, false}, L{65, 7, 33, true}}) {
    const uint64_t sd = seed++;
    cs.push_back({"linear_forward:f32",
                  "linear_forward[f32] " +
                      shape({{"N", l.N}, {"C", l.C}, {"OC", l.OC}, {"bias", l.bias}}),
                  kTolMat, kTolMatLowp, [l, sd](Arena& a) {
                    Rng r(sd);
                    const Vec x = r.normal(size_t(l.N) * l.C), w = r.normal(size_t(l.OC) * l.C, 0.2f),
                              b = r.normal(l.OC);
                    const Vec junk = r.normal(size_t(l.N) * l.OC);
                    float* out = a.up(junk);  // overwritten
                    a.ops().linear_forward(out, a.up(x), a.up(w), l.bias ? a.up(b) : nullptr,
                                           nullptr, l.N, l.C, l.OC);
                    Outputs o;
                    put(o, "out", a.down(out, junk.size()));
                    return o;
                  }});
    for (int full = 0; full < 2; ++full)
      cs.push_back({"linear_backward:add",
                    "linear_backward[add] " +
                        shape({{"N", l.N}, {"C", l.C}, {"OC", l.OC}, {"dinp,db", full}}),
                    kTolMat, kTolMatLowp, [l, sd, full](Arena& a) {
                      Rng r(sd + 1000);
                      const Vec x = r.normal(size_t(l.N) * l.C), w = r.normal(size_t(l.OC) * l.C, 0.2f),
                                dy = r.normal(size_t(l.N) * l.OC);
                      const Vec dx0 = r.normal(x.size()), dw0 = r.normal(w.size()),
                                db0 = r.normal(l.OC);
                      float* dx = a.up(dx0);
                      float* dw = a.up(dw0);
                      float* db = a.up(db0);
                      a.ops().linear_backward(full ? dx : nullptr, dw, full ? db : nullptr,
                                              a.up(dy), a.up(x), a.up(w), l.N, l.C, l.OC);
                      Outputs o;
                      put(o, "dinp", a.down(dx, dx0.size()));
                      put(o, "dw", a.down(dw, dw0.size()));
                      put(o, "db", a.down(db, db0.size()));
                      return o;
                    }});
    // The first-writer form: dinp starts as NaN (never read) and equals the accumulating op
    // on zeros ("set" and "acc0": paired_forms_exact holds them equal); dw, db accumulate.
    cs.push_back({"linear_backward:set",
                  "linear_backward[set] " + shape({{"N", l.N}, {"C", l.C}, {"OC", l.OC}}), kTolMat,
                  kTolMatLowp, [l, sd](Arena& a) {
                    Rng r(sd + 2000);
                    const Vec x = r.normal(size_t(l.N) * l.C), w = r.normal(size_t(l.OC) * l.C, 0.2f),
                              dy = r.normal(size_t(l.N) * l.OC);
                    const Vec dw0 = r.normal(w.size()), db0 = r.normal(l.OC);
                    const size_t nx = x.size();
                    float* dx = a.up(Vec(nx, NAN));
                    float* dx0 = a.up(Vec(nx, 0.f));
                    float* dw = a.up(dw0);
                    float* db = a.up(db0);
                    float* dwa = a.up(dw0);
                    float* dba = a.up(db0);
                    const float *pdy = a.up(dy), *px = a.up(x), *pw = a.up(w);
                    a.ops().linear_backward(sw::GradIn::set(dx), dw, db, pdy, px, pw, l.N, l.C,
                                            l.OC);
                    a.ops().linear_backward(dx0, dwa, dba, pdy, px, pw, l.N, l.C, l.OC);
                    Outputs o;
                    put(o, "set", a.down(dx, nx));
                    put(o, "acc0", a.down(dx0, nx));
                    put(o, "dw", a.down(dw, dw0.size()));
                    put(o, "dw_acc", a.down(dwa, dw0.size()));
                    put(o, "db", a.down(db, db0.size()));
                    put(o, "db_acc", a.down(dba, db0.size()));
                    return o;
                  }});
    // The 16-bit-input forms (BF16 / F16 Ops; F32 Ops give no outputs): the input narrowed on
    // the backend, against the fp32-input ops ("lp" / "ref" pairs for paired_forms_exact).
    // The weight fp32, 16-bit, or both (a unit's weights with their 16-bit copy; "w=f32",
    // "w=lp", "w=both"): the fp32 op reads the rounded weight, which all three forms hold.
    for (int wf = 0; wf < 3; ++wf)
    cs.push_back({"linear_forward:lp",
                  "linear_forward[lp] " + weight_form(wf) + " " +
                      shape({{"N", l.N}, {"C", l.C}, {"OC", l.OC}}),
                  kTolMat, kTolMatLowp, [l, sd, wf](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 3000);
                    const LinearLpInputs in(a, r, l.N, l.C, l.OC, l.bias, wf);
                    const size_t no = size_t(l.N) * l.OC;
                    float* out = a.up(Vec(no, NAN));
                    float* ref = a.up(Vec(no, NAN));
                    a.ops().linear_forward(out, in.x16, in.w.operand, in.b, nullptr, l.N, l.C,
                                           l.OC);
                    a.ops().linear_forward(ref, in.x, in.w.rounded, in.b, nullptr, l.N, l.C, l.OC);
                    put(o, "lp", a.down(out, no));
                    put(o, "ref", a.down(ref, no));
                    return o;
                  }});
    // The product with the residual added (16-bit inputs on BF16 / F16 Ops, fp32 ones on F32
    // Ops): against the other backend; each backend's product + residual_forward beside it
    // ("product then residual": CUDA's epilogue may sum the product in another order).
    for (int wf = 0; wf < 3; ++wf)
    cs.push_back({"linear_forward:residual",
                  "linear_forward[residual] " + weight_form(wf) + " " +
                      shape({{"N", l.N}, {"C", l.C}, {"OC", l.OC}}),
                  kTolMat, kTolMatLowp, [l, sd, wf](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    const size_t no = size_t(l.N) * l.OC;
                    float* out = a.up(Vec(no, NAN));
                    float* ref = a.up(Vec(no, NAN));
                    Rng r(sd + 3700);
                    if (dt == sw::DType::F32) {  // fp32 operands (one weight form)
                      if (wf != 0) return o;
                      const float* x = a.up(r.normal(size_t(l.N) * l.C));
                      const float* w = a.up(r.normal(size_t(l.OC) * l.C, 0.2f));
                      const Vec bv = r.normal(l.OC);
                      const float* b = l.bias ? a.up(bv) : nullptr;
                      const float* res = a.up(r.normal(no, 2.f));
                      a.ops().linear_forward(out, x, w, b, res, l.N, l.C, l.OC);
                      a.ops().linear_forward(ref, x, w, b, nullptr, l.N, l.C, l.OC);
                      a.ops().residual_forward(ref, ref, res, no);
                    } else {
                      const LinearLpInputs in(a, r, l.N, l.C, l.OC, l.bias, wf);
                      const float* res = a.up(r.normal(no, 2.f));
                      a.ops().linear_forward(out, in.x16, in.w.operand, in.b, res, l.N, l.C, l.OC);
                      a.ops().linear_forward(ref, in.x16, in.w.operand, in.b, nullptr, l.N, l.C,
                                             l.OC);
                      a.ops().residual_forward(ref, ref, res, no);
                    }
                    put(o, "out", a.down(out, no));
                    put(o, "product then residual", a.down(ref, no));
                    return o;
                  }});
    // The product's output in the compute precision: against the other backend only (cuBLAS
    // may sum a 16-bit output in another order than an fp32 one); each backend's fp32 output
    // narrowed beside it ("f32 narrowed") for a reader comparing the two.
    for (int wf = 0; wf < 3; ++wf)
    cs.push_back({"linear_forward:out16",
                  "linear_forward[out16] " + weight_form(wf) + " " +
                      shape({{"N", l.N}, {"C", l.C}, {"OC", l.OC}}),
                  kTolMat, kTolMatLowp, [l, sd, wf](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 3500);
                    const LinearLpInputs in(a, r, l.N, l.C, l.OC, l.bias, wf);
                    const size_t no = size_t(l.N) * l.OC;
                    uint16_t* out16 = up16(a, no);
                    uint16_t* ref16 = up16(a, no);
                    float* ref = a.up(Vec(no, NAN));
                    a.ops().linear_forward(out16, in.x16, in.w.operand, in.b, nullptr, l.N, l.C,
                                           l.OC);
                    a.ops().linear_forward(ref, in.x16, in.w.operand, in.b, nullptr, l.N, l.C,
                                           l.OC);
                    a.ops().narrow(dt, ref, ref16, no);
                    put(o, "out16", down16(a, out16, no, dt));
                    put(o, "f32 narrowed", down16(a, ref16, no, dt));
                    return o;
                  }});
    for (int wf = 0; wf < 3; ++wf)
    cs.push_back({"linear_backward:lp",
                  "linear_backward[lp] " + weight_form(wf) + " " +
                      shape({{"N", l.N}, {"C", l.C}, {"OC", l.OC}}),
                  kTolMat, kTolMatLowp, [l, sd, wf](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 4000);
                    const Vec x = r.normal(size_t(l.N) * l.C), w = r.normal(size_t(l.OC) * l.C, 0.2f),
                              dy = r.normal(size_t(l.N) * l.OC);
                    const Vec dw0 = r.normal(w.size()), db0 = r.normal(l.OC);
                    const size_t nx = x.size();
                    const float* px = a.up(x);
                    uint16_t* x16 = up16(a, nx);
                    a.ops().narrow(dt, px, x16, nx);
                    float *dx = a.up(Vec(nx, NAN)), *dxr = a.up(Vec(nx, NAN));
                    float *dw = a.up(dw0), *dwr = a.up(dw0), *db = a.up(db0), *dbr = a.up(db0);
                    const float* pdy = a.up(dy);
                    const WeightForms pw(a, w, wf);
                    a.ops().linear_backward(sw::GradIn::set(dx), dw, l.bias ? db : nullptr, pdy,
                                            x16, pw.operand, l.N, l.C, l.OC);
                    a.ops().linear_backward(sw::GradIn::set(dxr), dwr, l.bias ? dbr : nullptr, pdy,
                                            px, pw.rounded, l.N, l.C, l.OC);
                    put(o, "lp", a.down(dx, nx));
                    put(o, "ref", a.down(dxr, nx));
                    put(o, "dw", a.down(dw, dw0.size()));
                    put(o, "dw_ref", a.down(dwr, dw0.size()));
                    put(o, "db", a.down(db, db0.size()));
                    put(o, "db_ref", a.down(dbr, db0.size()));
                    return o;
                  }});
    // dout 16-bit too (db, where the linear has a bias, the sum of its widened values: the op
    // on the widened dout gives every result), x fp32 or 16-bit.
    for (int xlp = 0; xlp < 2; ++xlp)
      cs.push_back({"linear_backward:lp",
                    "linear_backward[lp] dout16 x16=" + std::to_string(xlp) + " " +
                        shape({{"N", l.N}, {"C", l.C}, {"OC", l.OC}}),
                    kTolMat, kTolMatLowp, [l, sd, xlp](Arena& a) {
                      Outputs o;
                      const sw::DType dt = a.ops().compute();
                      if (dt == sw::DType::F32) return o;
                      Rng r(sd + 5000);
                      const LinearBackLpInputs in(a, r, l.N, l.C, l.OC);
                      const Vec &w = in.w, &dw0 = in.dw0, &db0 = in.db0;
                      const size_t nx = in.x.size(), ny = in.dy.size();
                      const float* px = in.px;
                      uint16_t *x16 = in.x16, *dy16 = in.dy16;
                      float* dyw = a.up(Vec(ny, NAN));
                      a.ops().widen(dt, dy16, dyw, ny);
                      float *dx = a.up(Vec(nx, NAN)), *dxr = a.up(Vec(nx, NAN));
                      float *dw = a.up(dw0), *dwr = a.up(dw0), *db = a.up(db0), *dbr = a.up(db0);
                      // With x 16-bit, the weight too (every operand 16-bit: the CUDA
                      // backward's path with no narrowing at all).
                      const WeightForms fw(a, w, xlp ? 1 : 0);
                      a.ops().linear_backward(sw::GradIn::set(dx), dw, l.bias ? db : nullptr, dy16,
                                              xlp ? sw::Operand(x16) : sw::Operand(px), fw.operand,
                                              l.N, l.C, l.OC);
                      a.ops().linear_backward(sw::GradIn::set(dxr), dwr, l.bias ? dbr : nullptr,
                                              dyw, px, fw.rounded, l.N, l.C, l.OC);
                      put(o, "lp", a.down(dx, nx));
                      put(o, "ref", a.down(dxr, nx));
                      put(o, "dw", a.down(dw, dw0.size()));
                      put(o, "dw_ref", a.down(dwr, dw0.size()));
                      put(o, "db", a.down(db, db0.size()));
                      put(o, "db_ref", a.down(dbr, db0.size()));
                      return o;
                    }});
    // The input gradient in the compute precision: against the other backend only (cuBLAS
    // may sum a 16-bit output in another order), each backend's fp32 dinp narrowed beside it;
    // dw and db against the 16-bit operands' fp32 dinp's ("dw" / "dw_ref" and "db" / "db_ref" pairs,
    // exact on each backend). dout fp32 or 16-bit, every operand's form as the models hand
    // them.
    for (int wf = 0; wf < 3; ++wf)
      for (int dlp = 0; dlp < 2; ++dlp)
        cs.push_back({"linear_backward:dinp16",
                      "linear_backward[dinp16] " + weight_form(wf) + " dout16=" +
                          std::to_string(dlp) + " " +
                          shape({{"N", l.N}, {"C", l.C}, {"OC", l.OC}}),
                      kTolMat, kTolMatLowp, [l, sd, wf, dlp](Arena& a) {
                        Outputs o;
                        const sw::DType dt = a.ops().compute();
                        if (dt == sw::DType::F32) return o;
                        Rng r(sd + 5500);
                        const LinearBackLpInputs in(a, r, l.N, l.C, l.OC);
                        const Vec &w = in.w, &dw0 = in.dw0, &db0 = in.db0;
                        const size_t nx = in.x.size();
                        uint16_t* x16 = in.x16;
                        const sw::Operand dout = dlp ? sw::Operand(in.dy16) : sw::Operand(in.pdy);
                        const bool bias = l.bias;
                        uint16_t* dx16 = up16(a, nx);
                        uint16_t* ref16 = up16(a, nx);
                        float* dxr = a.up(Vec(nx, NAN));
                        float *dw = a.up(dw0), *dwr = a.up(dw0), *db = a.up(db0), *dbr = a.up(db0);
                        const WeightForms pw(a, w, wf);
                        a.ops().linear_backward(sw::GradIn::set(nullptr, dx16), dw,
                                                bias ? db : nullptr, dout, x16, pw.operand, l.N,
                                                l.C, l.OC);
                        a.ops().linear_backward(sw::GradIn::set(dxr), dwr, bias ? dbr : nullptr,
                                                dout, x16, pw.operand, l.N, l.C, l.OC);
                        a.ops().narrow(dt, dxr, ref16, nx);
                        put(o, "dinp16", down16(a, dx16, nx, dt));
                        put(o, "f32 narrowed", down16(a, ref16, nx, dt));
                        put(o, "dw", a.down(dw, dw0.size()));
                        put(o, "dw_ref", a.down(dwr, dw0.size()));
                        put(o, "db", a.down(db, db0.size()));
                        put(o, "db_ref", a.down(dbr, db0.size()));
                        return o;
                      }});
    // Parameter gradients written (GradOut::write, a step's first writer: their NaN contents
    // never read) against the same op adding into zeros, bitwise on each backend (paired
    // outputs), and within the tolerances across backends; then the
    // same op on no rows (N = 0), which writes zeros. form 0: linear_backward:set (fp32
    // operands, every Ops), 1: linear_backward:lp, 2: linear_backward:dinp16 (16-bit
    // operands as the models hand them; BF16 / F16 Ops only).
    for (int form = 0; form < 3; ++form) {
      const char* op = form == 0 ? "linear_backward:set"
                       : form == 1 ? "linear_backward:lp" : "linear_backward:dinp16";
      cs.push_back({op,
                    std::string(op) + " dw written " +
                        shape({{"N", l.N}, {"C", l.C}, {"OC", l.OC}}),
                    kTolMat, kTolMatLowp, [l, sd, form](Arena& a) {
                      Outputs o;
                      const sw::DType dt = a.ops().compute();
                      if (form > 0 && dt == sw::DType::F32) return o;
                      Rng r(sd + 6000);
                      // (LinearBackLpInputs' draws; narrowed only for the 16-bit forms)
                      const Vec x = r.normal(size_t(l.N) * l.C),
                                w = r.normal(size_t(l.OC) * l.C, 0.2f),
                                dy = r.normal(size_t(l.N) * l.OC);
                      struct {
                        const float *px, *pdy;
                        uint16_t *x16 = nullptr, *dy16 = nullptr;
                      } in{a.up(x), a.up(dy)};
                      if (form > 0) {
                        in.x16 = up16(a, x.size()), in.dy16 = up16(a, dy.size());
                        a.ops().narrow(dt, in.px, in.x16, x.size());
                        a.ops().narrow(dt, in.pdy, in.dy16, dy.size());
                      }
                      const size_t nx = x.size(), nw = w.size(), nb = size_t(l.OC);
                      const bool bias = l.bias;
                      const WeightForms pw(a, w, form == 0 ? 0 : 2);
                      float *dw = a.up(Vec(nw, NAN)), *db = a.up(Vec(nb, NAN));
                      float *dwr = a.up(Vec(nw, 0.f)), *dbr = a.up(Vec(nb, 0.f));
                      const sw::GradOut gw(dw, true), gb(bias ? db : nullptr, true);
                      float* dbr_ = bias ? dbr : nullptr;
                      auto run = [&](float* dx, uint16_t* dx16, sw::GradOut w_, sw::GradOut b_,
                                     int N) {
                        if (form == 0)
                          a.ops().linear_backward(sw::GradIn::set(dx), w_, b_, in.pdy, in.px,
                                                  pw.rounded, N, l.C, l.OC);
                        else if (form == 1)
                          a.ops().linear_backward(sw::GradIn::set(dx), w_, b_, in.dy16, in.x16,
                                                  pw.operand, N, l.C, l.OC);
                        else
                          a.ops().linear_backward(sw::GradIn::set(nullptr, dx16), w_, b_, in.dy16,
                                                  in.x16, pw.operand, N, l.C, l.OC);
                      };
                      if (form < 2) {
                        float *dx = a.up(Vec(nx, NAN)), *dxr = a.up(Vec(nx, NAN));
                        run(dx, nullptr, gw, gb, l.N);
                        run(dxr, nullptr, dwr, dbr_, l.N);
                        put(o, "dinp", a.down(dx, nx));
                        put(o, "dinp_ref", a.down(dxr, nx));
                      } else {
                        uint16_t *dx16 = up16(a, nx), *dxr16 = up16(a, nx);
                        run(nullptr, dx16, gw, gb, l.N);
                        run(nullptr, dxr16, dwr, dbr_, l.N);
                        put(o, "dinp16", down16(a, dx16, nx, dt));
                        put(o, "dinp16_ref", down16(a, dxr16, nx, dt));
                      }
                      put(o, "dw", a.down(dw, nw));
                      put(o, "dw_ref", a.down(dwr, nw));
                      if (bias) {
                        put(o, "db", a.down(db, nb));
                        put(o, "db_ref", a.down(dbr, nb));
                      }
                      // No rows: written gradients are zeros.
                      float *dw0 = a.up(Vec(nw, NAN)), *db0 = a.up(Vec(nb, NAN));
                      run(nullptr, nullptr, sw::GradOut(dw0, true),
                          sw::GradOut(bias ? db0 : nullptr, true), 0);
                      put(o, "dw N=0", a.down(dw0, nw));
                      put(o, "zeros", Vec(nw, 0.f));
                      if (bias) {
                        put(o, "db N=0", a.down(db0, nb));
                        put(o, "zeros", Vec(nb, 0.f));
                      }
                      return o;
                    }});
    }
  }

  // embedding: repeated tokens (V small), with and without positions.
  struct E { int B, T, C, V; bool wpe; };
  for (const E e : {E{3, 7, 45, 5, true}, E{2, 1, 64, 3, false}, E{4, 33, 300, 41, true}}) {
    const uint64_t sd = seed++;
    const std::string sh =
        shape({{"B", e.B}, {"T", e.T}, {"C", e.C}, {"V", e.V}, {"wpe", e.wpe}});
    cs.push_back({"embedding_forward:f32", "embedding_forward[f32] " + sh, kTolElem, kTolElem,
                  [e, sd](Arena& a) {
                    Rng r(sd);
                    const IVec tok = r.ints(size_t(e.B) * e.T, 0, e.V);
                    const Vec wte = r.normal(size_t(e.V) * e.C), wpe = r.normal(size_t(e.T) * e.C);
                    float* out = a.up(r.normal(size_t(e.B) * e.T * e.C));
                    a.ops().embedding_forward(out, a.up(tok), a.up(wte), e.wpe ? a.up(wpe) : nullptr,
                                              e.B, e.T, e.C, e.V);
                    Outputs o;
                    put(o, "out", a.down(out, size_t(e.B) * e.T * e.C));
                    return o;
                  }});
    // The table 16-bit only (BF16 / F16 Ops) against embedding_forward on its widened values
    // ("lp" / "ref", bit for bit on each backend); and the fp32 form through the same op.
    cs.push_back({"embedding_forward:lp", "embedding_forward[lp] " + sh, kTolElem, kTolElem,
                  [e, sd](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 500);
                    const IVec tok = r.ints(size_t(e.B) * e.T, 0, e.V);
                    const Vec wte = r.normal(size_t(e.V) * e.C), wpe = r.normal(size_t(e.T) * e.C);
                    const size_t nw = wte.size(), no = size_t(e.B) * e.T * e.C;
                    const float* pw = a.up(wte);
                    uint16_t* w16 = up16(a, nw);
                    a.ops().narrow(dt, pw, w16, nw);
                    float* ww = a.up(Vec(nw, NAN));
                    a.ops().widen(dt, w16, ww, nw);
                    const int32_t* pt = a.up(tok);
                    const float* pp = e.wpe ? a.up(wpe) : nullptr;
                    float *out = a.up(Vec(no, NAN)), *ref = a.up(Vec(no, NAN));
                    float* f = a.up(Vec(no, NAN));
                    float* fr = a.up(Vec(no, NAN));
                    a.ops().embedding_forward(out, pt, w16, pp, e.B, e.T, e.C, e.V);
                    a.ops().embedding_forward(ref, pt, ww, pp, e.B, e.T, e.C, e.V);
                    a.ops().embedding_forward(f, pt, sw::Operand(pw), pp, e.B, e.T, e.C, e.V);
                    a.ops().embedding_forward(fr, pt, pw, pp, e.B, e.T, e.C, e.V);
                    put(o, "lp", a.down(out, no));
                    put(o, "ref", a.down(ref, no));
                    put(o, "f32", a.down(f, no));
                    put(o, "f32 ref", a.down(fr, no));
                    return o;
                  }});
    cs.push_back({"embedding_backward", "embedding_backward " + sh, kTolElem, kTolElem,
                  [e, sd](Arena& a) {
                    Rng r(sd + 1000);
                    const IVec tok = r.ints(size_t(e.B) * e.T, 0, e.V);
                    const Vec dy = r.normal(size_t(e.B) * e.T * e.C);
                    const Vec dwte0 = r.normal(size_t(e.V) * e.C), dwpe0 = r.normal(size_t(e.T) * e.C);
                    float* dwte = a.up(dwte0);
                    float* dwpe = a.up(dwpe0);
                    a.ops().embedding_backward(dwte, e.wpe ? dwpe : nullptr, a.up(dy), a.up(tok),
                                               e.B, e.T, e.C);
                    Outputs o;
                    put(o, "dwte", a.down(dwte, dwte0.size()));
                    put(o, "dwpe", a.down(dwpe, dwpe0.size()));
                    return o;
                  }});
  }

  // Norms: forward, fused residual forward (also with res aliasing a), backward.
  struct Nm { int N, C; bool bias; };
  for (const Nm s : {Nm{13, 77, true}, Nm{1, 1000, false}, Nm{300, 33, true}, Nm{1000, 96, true}}) {
    const uint64_t sd = seed++;
    const std::string sh = shape({{"N", s.N}, {"C", s.C}, {"bias", s.bias}});
    const size_t NC = size_t(s.N) * s.C;
    cs.push_back({"layernorm_forward:f32", "layernorm_forward[f32] " + sh, kTolNorm, kTolNorm,
                  [s, sd, NC](Arena& a) {
                    Rng r(sd);
                    const Vec x = r.normal(NC, 2.f, 0.5f), w = r.normal(s.C, 0.5f, 1.f),
                              b = r.normal(s.C, 0.3f);
                    float* out = a.up(Vec(NC));
                    float* mean = a.up(Vec(s.N));
                    float* rstd = a.up(Vec(s.N));
                    a.ops().layernorm_forward(out, mean, rstd, a.up(x), a.up(w),
                                              s.bias ? a.up(b) : nullptr, s.N, s.C);
                    Outputs o;
                    put(o, "out", a.down(out, NC));
                    put(o, "mean", a.down(mean, s.N));
                    put(o, "rstd", a.down(rstd, s.N));
                    return o;
                  }});
    cs.push_back({"rmsnorm_forward:f32", "rmsnorm_forward[f32] " + sh, kTolNorm, kTolNorm,
                  [s, sd, NC](Arena& a) {
                    Rng r(sd + 1);
                    const Vec x = r.normal(NC, 2.f, 0.5f), w = r.normal(s.C, 0.5f, 1.f);
                    float* out = a.up(Vec(NC));
                    float* rstd = a.up(Vec(s.N));
                    a.ops().rmsnorm_forward(out, rstd, a.up(x), a.up(w), s.N, s.C, 1e-6f);
                    Outputs o;
                    put(o, "out", a.down(out, NC));
                    put(o, "rstd", a.down(rstd, s.N));
                    return o;
                  }});
    for (int alias = 0; alias < 2; ++alias) {
      cs.push_back({"layernorm_forward:residual",
                    "layernorm_forward[residual] " + sh + " res=a:" + std::to_string(alias),
                    kTolNorm, kTolNorm, [s, sd, NC, alias](Arena& a) {
                      Rng r(sd + 2);
                      const Vec x = r.normal(NC), y = r.normal(NC, 2.f),
                                w = r.normal(s.C, 0.5f, 1.f), b = r.normal(s.C, 0.3f);
                      float* pa = a.up(x);
                      float* res = alias ? pa : a.up(Vec(NC));
                      float* out = a.up(Vec(NC));
                      float* mean = a.up(Vec(s.N));
                      float* rstd = a.up(Vec(s.N));
                      a.ops().layernorm_forward(out, mean, rstd,
                                                sw::NormIn::residual(res, pa, a.up(y)), a.up(w),
                                                s.bias ? a.up(b) : nullptr, s.N, s.C);
                      Outputs o;
                      put(o, "res", a.down(res, NC));
                      put(o, "out", a.down(out, NC));
                      put(o, "mean", a.down(mean, s.N));
                      put(o, "rstd", a.down(rstd, s.N));
                      return o;
                    }});
      cs.push_back({"rmsnorm_forward:residual",
                    "rmsnorm_forward[residual] " + sh + " res=a:" + std::to_string(alias),
                    kTolNorm, kTolNorm, [s, sd, NC, alias](Arena& a) {
                      Rng r(sd + 3);
                      const Vec x = r.normal(NC), y = r.normal(NC, 2.f), w = r.normal(s.C, 0.5f, 1.f);
                      float* pa = a.up(x);
                      float* res = alias ? pa : a.up(Vec(NC));
                      float* out = a.up(Vec(NC));
                      float* rstd = a.up(Vec(s.N));
                      a.ops().rmsnorm_forward(out, rstd, sw::NormIn::residual(res, pa, a.up(y)),
                                              a.up(w), s.N, s.C, 1e-5f);
                      Outputs o;
                      put(o, "res", a.down(res, NC));
                      put(o, "out", a.down(out, NC));
                      put(o, "rstd", a.down(rstd, s.N));
                      return o;
                    }});
    }
    // The 16-bit-output forms against narrow of the fp32 ones (statistics and res equal too).
    for (int ln = 0; ln < 2; ++ln)
      for (int fused = 0; fused < 2; ++fused) {
        const char* op = ln ? (fused ? "layernorm_forward:residual_out16"
                                     : "layernorm_forward:out16")
                            : (fused ? "rmsnorm_forward:residual_out16" : "rmsnorm_forward:out16");
        cs.push_back({op, std::string(op) + " " + sh, kTolRound16, kTolRound16,
                      [s, sd, NC, ln, fused](Arena& a) {
                        Outputs o;
                        const sw::DType dt = a.ops().compute();
                        if (dt == sw::DType::F32) return o;
                        Rng r(sd + 7);
                        const Vec x = r.normal(NC, 2.f, 0.5f), y = r.normal(NC),
                                  w = r.normal(s.C, 0.5f, 1.f), b = r.normal(s.C, 0.3f);
                        const float *px = a.up(x), *py = a.up(y), *pw = a.up(w);
                        const float* pb = s.bias ? a.up(b) : nullptr;
                        uint16_t* lp = up16(a, NC);
                        uint16_t* ref = up16(a, NC);
                        float* f = a.up(Vec(NC, NAN));
                        float *res = a.up(Vec(NC, NAN)), *resr = a.up(Vec(NC, NAN));
                        float *m = a.up(Vec(s.N, NAN)), *mr = a.up(Vec(s.N, NAN));
                        float *rs = a.up(Vec(s.N, NAN)), *rsr = a.up(Vec(s.N, NAN));
                        const sw::Ops& op = a.ops();
                        if (ln && fused) {
                          op.layernorm_forward(lp, m, rs, sw::NormIn::residual(res, px, py), pw, pb,
                                               s.N, s.C);
                          op.layernorm_forward(f, mr, rsr, sw::NormIn::residual(resr, px, py), pw,
                                               pb, s.N, s.C);
                        } else if (ln) {
                          op.layernorm_forward(lp, m, rs, px, pw, pb, s.N, s.C);
                          op.layernorm_forward(f, mr, rsr, px, pw, pb, s.N, s.C);
                        } else if (fused) {
                          op.rmsnorm_forward(lp, rs, sw::NormIn::residual(res, px, py), pw, s.N,
                                             s.C, 1e-5f);
                          op.rmsnorm_forward(f, rsr, sw::NormIn::residual(resr, px, py), pw, s.N,
                                             s.C, 1e-5f);
                        } else {
                          op.rmsnorm_forward(lp, rs, px, pw, s.N, s.C, 1e-6f);
                          op.rmsnorm_forward(f, rsr, px, pw, s.N, s.C, 1e-6f);
                        }
                        op.narrow(dt, f, ref, NC);
                        put(o, "lp", down16(a, lp, NC, dt));
                        put(o, "ref", down16(a, ref, NC, dt));
                        put(o, "rstd", a.down(rs, s.N));
                        put(o, "rstd_ref", a.down(rsr, s.N));
                        if (ln) {
                          put(o, "mean", a.down(m, s.N));
                          put(o, "mean_ref", a.down(mr, s.N));
                        }
                        if (fused) {
                          put(o, "res", a.down(res, NC));
                          put(o, "res_ref", a.down(resr, NC));
                        }
                        return o;
                      }});
      }
    cs.push_back({"layernorm_backward:f32", "layernorm_backward[f32] " + sh, kTolNorm, kTolNorm,
                  [s, sd, NC](Arena& a) {
                    Rng r(sd + 4);
                    const Vec x = r.normal(NC, 2.f, 0.5f), w = r.normal(s.C, 0.5f, 1.f),
                              dy = r.normal(NC);
                    Vec mean, rstd;
                    norm_stats(x, s.N, s.C, 1e-5f, &mean, rstd);
                    const Vec dx0 = r.normal(NC), dw0 = r.normal(s.C), db0 = r.normal(s.C);
                    float* dx = a.up(dx0);
                    float* dw = a.up(dw0);
                    float* db = a.up(db0);
                    a.ops().layernorm_backward(dx, dw, s.bias ? db : nullptr, a.up(dy), a.up(x),
                                               a.up(w), a.up(mean), a.up(rstd), s.N, s.C);
                    Outputs o;
                    put(o, "dinp", a.down(dx, NC));
                    put(o, "dw", a.down(dw, s.C));
                    put(o, "db", a.down(db, s.C));
                    return o;
                  }});
    cs.push_back({"rmsnorm_backward:f32", "rmsnorm_backward[f32] " + sh, kTolNorm, kTolNorm,
                  [s, sd, NC](Arena& a) {
                    Rng r(sd + 5);
                    const Vec x = r.normal(NC, 2.f, 0.5f), w = r.normal(s.C, 0.5f, 1.f),
                              dy = r.normal(NC);
                    Vec rstd;
                    norm_stats(x, s.N, s.C, 1e-6f, nullptr, rstd);
                    const Vec dx0 = r.normal(NC), dw0 = r.normal(s.C);
                    float* dx = a.up(dx0);
                    float* dw = a.up(dw0);
                    a.ops().rmsnorm_backward(dx, dw, a.up(dy), a.up(x), a.up(w), a.up(rstd), s.N,
                                             s.C);
                    Outputs o;
                    put(o, "dinp", a.down(dx, NC));
                    put(o, "dw", a.down(dw, s.C));
                    return o;
                  }});
    // The residual gradient in both forms (*_backward_lp) beside the fp32 op and its narrowing:
    // "dinp" / "dinp_ref", "lp" / "ref", "dw" / "dw_ref" (and "db" / "db_ref") pairs, bit for
    // bit on each backend (paired_forms_exact).
    for (int ln = 0; ln < 2; ++ln) {
      const char* op = ln ? "layernorm_backward:both" : "rmsnorm_backward:both";
      cs.push_back({op, std::string(op) + " " + sh, kTolRound16, kTolRound16,
                    [s, sd, NC, ln](Arena& a) {
                      Outputs o;
                      const sw::Ops& ops = a.ops();
                      const sw::DType dt = ops.compute();
                      if (dt == sw::DType::F32) return o;
                      Rng r(sd + 11);
                      const float eps = ln ? 1e-5f : 1e-6f;
                      const Vec x = r.normal(NC, 2.f, 0.5f), w = r.normal(s.C, 0.5f, 1.f),
                                dy = r.normal(NC);
                      Vec mean, rstd;
                      norm_stats(x, s.N, s.C, eps, ln ? &mean : nullptr, rstd);
                      const Vec dx0 = r.normal(NC), dw0 = r.normal(s.C), db0 = r.normal(s.C);
                      float *dx = a.up(dx0), *dxr = a.up(dx0);
                      float *dw = a.up(dw0), *dwr = a.up(dw0);
                      float *db = a.up(db0), *dbr = a.up(db0);
                      uint16_t* lp = up16(a, NC);
                      uint16_t* ref = up16(a, NC);
                      const float *px = a.up(x), *pw = a.up(w), *pdy = a.up(dy);
                      const float* pr = a.up(rstd);
                      if (ln) {
                        const float* pm = a.up(mean);
                        float* b = s.bias ? db : nullptr;
                        float* br = s.bias ? dbr : nullptr;
                        ops.layernorm_backward(sw::GradIn::add(dx, lp), dw, b, pdy, px, pw, pm, pr,
                                               s.N, s.C);
                        ops.layernorm_backward(dxr, dwr, br, pdy, px, pw, pm, pr, s.N, s.C);
                      } else {
                        ops.rmsnorm_backward(sw::GradIn::add(dx, lp), dw, pdy, px, pw, pr, s.N,
                                             s.C);
                        ops.rmsnorm_backward(dxr, dwr, pdy, px, pw, pr, s.N, s.C);
                      }
                      ops.narrow(dt, dxr, ref, NC);
                      put(o, "dinp", a.down(dx, NC));
                      put(o, "dinp_ref", a.down(dxr, NC));
                      put(o, "lp", down16(a, lp, NC, dt));
                      put(o, "ref", down16(a, ref, NC, dt));
                      put(o, "dw", a.down(dw, s.C));
                      put(o, "dw_ref", a.down(dwr, s.C));
                      if (ln) {
                        put(o, "db", a.down(db, s.C));
                        put(o, "db_ref", a.down(dbr, s.C));
                      }
                      return o;
                    }});
    }
  }

  // Element-wise: GELU (inputs past the clamp at +-10 included), SwiGLU, residual.
  for (const size_t n : {size_t{1}, size_t{1001}, size_t{70000}}) {
    const uint64_t sd = seed++;
    const std::string sh = shape({{"n", long(n)}});
    cs.push_back({"gelu_forward:f32", "gelu_forward[f32] " + sh, kTolElem, kTolElem,
                  [n, sd](Arena& a) {
                    Rng r(sd);
                    const Vec x = r.normal(n, 4.f);
                    float* out = a.up(Vec(n));
                    a.ops().gelu_forward(out, a.up(x), n);
                    Outputs o;
                    put(o, "out", a.down(out, n));
                    return o;
                  }});
    cs.push_back({"gelu_backward:add", "gelu_backward[add] " + sh, kTolElem, kTolElem,
                  [n, sd](Arena& a) {
                    Rng r(sd + 1);
                    const Vec x = r.normal(n, 4.f), dy = r.normal(n), dx0 = r.normal(n);
                    float* dx = a.up(dx0);
                    a.ops().gelu_backward(dx, a.up(x), a.up(dy), n);
                    Outputs o;
                    put(o, "dinp", a.down(dx, n));
                    return o;
                  }});
    cs.push_back({"gelu_forward:out16", "gelu_forward[out16] " + sh, kTolRound16, kTolRound16,
                  [n, sd](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 4);
                    const float* x = a.up(r.normal(n, 4.f));
                    uint16_t* lp = up16(a, n);
                    uint16_t* ref = up16(a, n);
                    float* f = a.up(Vec(n, NAN));
                    a.ops().gelu_forward(lp, x, n);
                    a.ops().gelu_forward(f, x, n);
                    a.ops().narrow(dt, f, ref, n);
                    put(o, "lp", down16(a, lp, n, dt));
                    put(o, "ref", down16(a, ref, n, dt));
                    // the input 16-bit (a product's output kept so), against its widened values
                    uint16_t* x16 = up16(a, n);
                    a.ops().narrow(dt, x, x16, n);
                    float* xw = a.up(Vec(n, NAN));
                    a.ops().widen(dt, x16, xw, n);
                    a.ops().gelu_forward(lp, x16, n);
                    a.ops().gelu_forward(f, xw, n);
                    a.ops().narrow(dt, f, ref, n);
                    put(o, "lp x16", down16(a, lp, n, dt));
                    put(o, "ref x16", down16(a, ref, n, dt));
                    return o;
                  }});
    cs.push_back({"gelu_backward:set", "gelu_backward[set] " + sh, kTolElem, kTolElem,
                  [n, sd](Arena& a) {
                    Rng r(sd + 3);
                    const Vec x = r.normal(n, 4.f), dy = r.normal(n);
                    float* dx = a.up(Vec(n, NAN));
                    float* dx0 = a.up(Vec(n, 0.f));
                    const float *px = a.up(x), *pdy = a.up(dy);
                    a.ops().gelu_backward(sw::GradIn::set(dx), px, pdy, n);
                    a.ops().gelu_backward(dx0, px, pdy, n);
                    Outputs o;
                    put(o, "set", a.down(dx, n));
                    put(o, "acc0", a.down(dx0, n));
                    return o;
                  }});
    // Both forms in one pass (BF16 / F16 Ops): the fp32 one the fp32 form's, the 16-bit
    // one its narrowing ("lp" / "ref" pairs for paired_forms_exact).
    cs.push_back({"gelu_backward:lp", "gelu_backward[lp] " + sh, kTolRound16, kTolRound16,
                  [n, sd](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 4);
                    const Vec x = r.normal(n, 4.f), dy = r.normal(n);
                    const float *px = a.up(x), *pdy = a.up(dy);
                    float* dx = a.up(Vec(n, NAN));
                    uint16_t* dx16 = up16(a, n);
                    float* ref = a.up(Vec(n, NAN));
                    uint16_t* ref16 = up16(a, n);
                    const Narrowed16 x16(a, px, n), dy16(a, pdy, n);
                    // The op on (xin, din) against the written fp32 form on (xref, dref), both forms
                    auto pair = [&](const std::string& tag, sw::Operand xin, const float* xref,
                                    sw::Operand din, const float* dref) {
                      a.ops().gelu_backward(sw::GradIn::set(dx, dx16), xin, din, n);
                      a.ops().gelu_backward(sw::GradIn::set(ref), xref, dref, n);
                      a.ops().narrow(dt, ref, ref16, n);
                      put(o, "lp" + tag, a.down(dx, n));
                      put(o, "ref" + tag, a.down(ref, n));
                      put(o, "lp16" + tag, down16(a, dx16, n, dt));
                      put(o, "ref16" + tag, down16(a, ref16, n, dt));
                    };
                    pair("", px, px, pdy, pdy);
                    // the input 16-bit, against its widened values
                    pair(" x16", x16.lp, x16.wide, pdy, pdy);
                    // dout 16-bit too (a product's input gradient kept 16-bit)
                    pair(" dy16", x16.lp, x16.wide, dy16.lp, dy16.wide);
                    // dout 16-bit, x fp32
                    a.ops().gelu_backward(sw::GradIn::set(dx, nullptr), px, dy16.lp, n);
                    a.ops().gelu_backward(sw::GradIn::set(ref), px, dy16.wide, n);
                    put(o, "lp x32 dy16", a.down(dx, n));
                    put(o, "ref x32 dy16", a.down(ref, n));
                    // the 16-bit form alone (GPT-2's dfch)
                    uint16_t* only16 = up16(a, n);
                    a.ops().gelu_backward(sw::GradIn::set(nullptr, only16), x16.lp, dy16.lp, n);
                    a.ops().gelu_backward(sw::GradIn::set(ref), x16.wide, dy16.wide, n);
                    a.ops().narrow(dt, ref, ref16, n);
                    put(o, "lp16 only", down16(a, only16, n, dt));
                    put(o, "ref16 only", down16(a, ref16, n, dt));
                    return o;
                  }});
    cs.push_back({"residual_forward", "residual_forward " + sh, kTolElem, kTolElem,
                  [n, sd](Arena& a) {
                    Rng r(sd + 2);
                    float* x = a.up(r.normal(n));
                    float* out = a.up(Vec(n));
                    float* y = a.up(r.normal(n));
                    a.ops().residual_forward(out, x, y, n);
                    a.ops().residual_forward(x, x, y, n);  // out aliasing a
                    Outputs o;
                    put(o, "out", a.down(out, n));
                    put(o, "aliased", a.down(x, n));
                    return o;
                  }});
    // Utilities.
    cs.push_back({"scale", "scale " + sh, kTolElem, kTolElem, [n, sd](Arena& a) {
                    Rng r(sd + 3);
                    float* x = a.up(r.normal(n));
                    a.ops().scale(x, -0.37f, n);
                    Outputs o;
                    put(o, "x", a.down(x, n));
                    return o;
                  }});
    cs.push_back({"fill", "fill " + sh, kTolElem, kTolElem, [n, sd](Arena& a) {
                    Rng r(sd + 4);
                    float* x = a.up(r.normal(n + 1));
                    a.ops().fill(x, 2.5f, n);  // the last element stays
                    Outputs o;
                    put(o, "x", a.down(x, n + 1));
                    return o;
                  }});
    cs.push_back({"add_inplace", "add_inplace " + sh, kTolElem, kTolElem, [n, sd](Arena& a) {
                    Rng r(sd + 5);
                    float* y = a.up(r.normal(n));
                    a.ops().add_inplace(y, a.up(r.normal(n)), n);
                    Outputs o;
                    put(o, "y", a.down(y, n));
                    return o;
                  }});
    cs.push_back({"copy", "copy " + sh, kTolElem, kTolElem, [n, sd](Arena& a) {
                    Rng r(sd + 6);
                    float* d = a.up(r.normal(n + 1));
                    a.ops().copy(d, a.up(r.normal(n)), n);
                    Outputs o;
                    put(o, "dst", a.down(d, n + 1));
                    return o;
                  }});
    // Precision conversions (raw 16-bit results are compared as the values they hold).
    for (sw::DType dt : {sw::DType::BF16, sw::DType::F16}) {
      const std::string dn = std::string(sw::dtype_name(dt)) + " " + sh;
      auto halves = [dt](const Vec& raw, size_t n) {
        Vec v(n);
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, reinterpret_cast<const char*>(raw.data()) + 2 * i, 2);
          v[i] = dt == sw::DType::BF16 ? sw::bf16_to_f32(h) : sw::f16_to_f32(h);
        }
        return v;
      };
      auto narrow_raw = [dt](const Vec& x) {  // the host's rounding, packed two per float
        Vec raw((x.size() + 1) / 2 + 1, 0.f);
        for (size_t i = 0; i < x.size(); ++i) {
          const uint16_t h = dt == sw::DType::BF16 ? sw::f32_to_bf16(x[i]) : sw::f32_to_f16(x[i]);
          std::memcpy(reinterpret_cast<char*>(raw.data()) + 2 * i, &h, 2);
        }
        return raw;
      };
      cs.push_back({"narrow", "narrow " + dn, kTolElem, kTolElem, [=](Arena& a) {
                      Rng r(sd + 30);
                      const Vec x = r.normal(n, 3.f);
                      float* src = a.up(x);
                      float* dst = a.up(Vec((n + 1) / 2 + 1, 0.f));
                      a.ops().narrow(dt, src, dst, n);
                      float* inplace = a.up(x);
                      a.ops().narrow(dt, inplace, inplace, n);
                      Outputs o;
                      put(o, "out", halves(a.down(dst, (n + 1) / 2 + 1), n));
                      put(o, "in_place", halves(a.down(inplace, n), n));
                      return o;
                    }});
      cs.push_back({"widen", "widen " + dn, kTolElem, kTolElem, [=](Arena& a) {
                      Rng r(sd + 31);
                      const Vec raw = narrow_raw(r.normal(n, 3.f));
                      float* dst = a.up(Vec(n, 0.f));
                      a.ops().widen(dt, a.up(raw), dst, n);
                      Vec buf(n, 0.f);
                      std::memcpy(buf.data(), raw.data(), std::min(raw.size(), buf.size()) * 4);
                      float* inplace = a.up(buf);
                      a.ops().widen(dt, inplace, inplace, n);
                      Outputs o;
                      put(o, "out", a.down(dst, n));
                      put(o, "in_place", a.down(inplace, n));
                      return o;
                    }});
      cs.push_back({"add_widened", "add_widened " + dn, kTolElem, kTolElem, [=](Arena& a) {
                      Rng r(sd + 32);
                      const Vec raw = narrow_raw(r.normal(n, 3.f));
                      float* y = a.up(r.normal(n));
                      a.ops().add_widened(dt, a.up(raw), y, n);
                      Outputs o;
                      put(o, "y", a.down(y, n));
                      return o;
                    }});
      cs.push_back({"round_to", "round_to " + dn, kTolElem, kTolElem, [=](Arena& a) {
                      Rng r(sd + 33);
                      float* x = a.up(r.normal(n, 3.f));
                      a.ops().round_to(dt, x, n);
                      Outputs o;
                      put(o, "x", a.down(x, n));
                      return o;
                    }});
      // One pass out of place, and in place, each beside copy + round_to ("ref"; pairs that
      // paired_forms_exact holds equal).
      cs.push_back({"round_copy:f32", "round_copy[f32] " + dn, kTolElem, kTolElem, [=](Arena& a) {
                      Rng r(sd + 34);
                      const Vec x = r.normal(n, 3.f);
                      const float* src = a.up(x);
                      float* dst = a.up(Vec(n, NAN));
                      a.ops().round_copy(dt, dst, src, n);
                      float* in_place = a.up(x);
                      a.ops().round_copy(dt, in_place, in_place, n);
                      float* ref = a.up(Vec(n, NAN));
                      a.ops().copy(ref, src, n);
                      a.ops().round_to(dt, ref, n);
                      Outputs o;
                      put(o, "out", a.down(dst, n));
                      put(o, "ref", a.down(ref, n));
                      put(o, "in_place", a.down(in_place, n));
                      put(o, "ref_again", a.down(ref, n));
                      return o;
                    }});
      // Both copies from the master in one pass ("out", "out16") against round_copy and narrow
      // ("ref", "ref16"), out of place and in place.
      cs.push_back({"round_copy:lp", "round_copy[lp] " + dn, kTolElem, kTolElem, [=](Arena& a) {
                      Rng r(sd + 35);
                      const Vec x = r.normal(n, 3.f);
                      const float* src = a.up(x);
                      float* dst = a.up(Vec(n, NAN));
                      uint16_t* d16 = up16(a, n);
                      a.ops().round_copy_lp(dt, dst, d16, src, n);
                      float* in_place = a.up(x);
                      uint16_t* i16 = up16(a, n);
                      a.ops().round_copy_lp(dt, in_place, i16, in_place, n);
                      float* ref = a.up(Vec(n, NAN));
                      uint16_t* r16 = up16(a, n);
                      a.ops().round_copy(dt, ref, src, n);
                      a.ops().narrow(dt, src, r16, n);
                      Outputs o;
                      put(o, "out", a.down(dst, n));
                      put(o, "ref", a.down(ref, n));
                      put(o, "out16", down16(a, d16, n, dt));
                      put(o, "ref16", down16(a, r16, n, dt));
                      put(o, "in_place", a.down(in_place, n));
                      put(o, "ref_again", a.down(ref, n));
                      put(o, "in_place16", down16(a, i16, n, dt));
                      put(o, "ref16_again", down16(a, r16, n, dt));
                      return o;
                    }});
    }
    cs.push_back({"sums_of_squares:host", "sums_of_squares[host] " + sh, kTolElem, kTolElem,
                  [n, sd](Arena& a) {
                    Rng r(sd + 8);
                    const float* xs[3] = {a.up(r.normal(n, 2.f)), a.up(r.normal(n / 2 + 1)),
                                          a.up(r.normal(1, 5.f))};
                    const size_t ns[3] = {n, n / 2 + 1, 1};
                    double out[3] = {-1, -1, -1};
                    a.ops().sum_squares_each(xs, ns, 3, out);
                    return Outputs{{"sums", {out[0], out[1], out[2]}}};
                  }});
    cs.push_back({"sums_of_squares:device", "sums_of_squares[device] " + sh, kTolElem, kTolElem,
                  [n, sd](Arena& a) {
                    Rng r(sd + 9);
                    const float* xs[3] = {a.up(r.normal(n, 2.f)), a.up(r.normal(1, 5.f)),
                                          a.up(r.normal(n / 3 + 1))};
                    const size_t ns[3] = {n, 1, n / 3 + 1};
                    double* out = a.up(std::vector<double>{-1, -1, -1, 7});
                    a.ops().sum_squares_into(xs, ns, 3, out);
                    return Outputs{{"sums", a.down(out, 4)}};  // the 4th stays 7
                  }});
    // The sums of values rounded as they are read, against the device sums of rounded
    // copies ("rounded" / "ref" pairs, bit for bit on each backend); the inputs only read.
    cs.push_back({"sums_of_squares:rounded", "sums_of_squares[rounded] " + sh, kTolElem,
                  kTolElem, [n, sd](Arena& a) {
                    Outputs o;
                    for (sw::DType dt : {sw::DType::BF16, sw::DType::F16}) {
                      Rng r(sd + 10);
                      const Vec x0 = r.normal(n, 2.f), x1 = r.normal(1, 5.f),
                                x2 = r.normal(n / 3 + 1);
                      const float* xs[3] = {a.up(x0), a.up(x1), a.up(x2)};
                      float* rs[3] = {a.up(x0), a.up(x1), a.up(x2)};
                      const size_t ns[3] = {n, 1, n / 3 + 1};
                      for (int i = 0; i < 3; ++i) a.ops().round_to(dt, rs[i], ns[i]);
                      double* out = a.up(std::vector<double>{-1, -1, -1, 7});
                      double* ref = a.up(std::vector<double>{-1, -1, -1, 7});
                      a.ops().sum_squares_rounded_into(dt, xs, ns, 3, out);
                      const float* rc[3] = {rs[0], rs[1], rs[2]};
                      a.ops().sum_squares_into(rc, ns, 3, ref);
                      const std::string d = std::string(" ") + sw::dtype_name(dt);
                      o.push_back({"rounded" + d, a.down(out, 4)});  // the 4th stays 7
                      o.push_back({"ref" + d, a.down(ref, 4)});
                      put(o, "x0 after" + d, a.down(xs[0], n));
                      put(o, "x0" + d, x0);
                    }
                    return o;
                  }});
    cs.push_back({"sums_of_squares:one", "sums_of_squares[one] " + sh, kTolElem, kTolElem,
                  [n, sd](Arena& a) {
                    Rng r(sd + 7);
                    const double s = a.ops().sum_squares(a.up(r.normal(n, 3.f)), n);
                    return Outputs{{"sum", {s}}};
                  }});
    // SGD with momentum (dampening, a LARS scale, step 1 then 2) and Nesterov; Lamb's first
    // half (m, v and the update written into grad) and the second (add_scaled).
    for (const bool nest : {false, true})
      cs.push_back({nest ? "sgd:nesterov" : "sgd:momentum",
                    std::string("sgd[") + (nest ? "nesterov] " : "momentum] ") + sh, kTolElem,
                    kTolElem, [n, sd, nest](Arena& a) {
                      Rng r(sd + 18);
                      float* p = a.up(r.normal(n));
                      float* m = a.up(r.normal(n, 0.1f));
                      const Vec g = r.normal(n);
                      const float damp = nest ? 0.f : 0.1f;
                      a.ops().sgd(p, a.up(g), m, n, 1e-2f, 0.9f, damp, nest, 0.01f, 0.7f, 1, 0.5f);
                      a.ops().sgd(p, a.up(g), m, n, 3e-2f, 0.9f, damp, nest, 0.f, 1.f, 2, 1.f);
                      Outputs o;
                      put(o, "param", a.down(p, n));
                      put(o, "m", a.down(m, n));
                      return o;
                    }});
    cs.push_back({"lamb_prepare", "lamb_prepare " + sh, kTolElem, kTolElem, [n, sd](Arena& a) {
                    Rng r(sd + 19);
                    float* p = a.up(r.normal(n));
                    float* g = a.up(r.normal(n));
                    float* m = a.up(r.normal(n, 0.1f));
                    float* v = a.up(r.uniform(n, 0.f, 0.01f));
                    a.ops().lamb_prepare(p, g, m, v, n, 0.9f, 0.999f, 1e-6f, 0.01f, 0.5f);
                    Outputs o;
                    put(o, "update", a.down(g, n));
                    put(o, "m", a.down(m, n));
                    put(o, "v", a.down(v, n));
                    return o;
                  }});
    cs.push_back({"add_scaled", "add_scaled " + sh, kTolElem, kTolElem, [n, sd](Arena& a) {
                    Rng r(sd + 20);
                    float* y = a.up(r.normal(n));
                    a.ops().add_scaled(y, -0.37f, a.up(r.normal(n)), n);
                    Outputs o;
                    put(o, "y", a.down(y, n));
                    return o;
                  }});
    cs.push_back({"adamw:plain", "adamw[plain] " + sh, kTolElem, kTolElem, [n, sd](Arena& a) {
                    Rng r(sd + 8);
                    float* p = a.up(r.normal(n));
                    float* m = a.up(r.normal(n, 0.1f));
                    float* v = a.up(r.uniform(n, 0.f, 0.01f));
                    const Vec g = r.normal(n);
                    a.ops().adamw(p, a.up(g), m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.5f);
                    a.ops().adamw(p, a.up(g), m, v, n, 3e-4f, 0.9f, 0.999f, 1e-8f, 0.f, 1, 1.f);
                    Outputs o;
                    put(o, "param", a.down(p, n));
                    put(o, "m", a.down(m, n));
                    put(o, "v", a.down(v, n));
                    return o;
                  }});
    // The update with its compute copies (16-bit, and fp32 or none), against adamw followed by
    // round_copy with a 16-bit copy on the same inputs: "lp" / "ref" pairs, bit for bit on each backend. With
    // `rounded`, the gradient read rounded to the other 16-bit type (grad_dt), against adamw on
    // a rounded copy of it.
    for (int with32 = 0; with32 < 2; ++with32)
    for (int rounded = 0; rounded < 2; ++rounded)
    cs.push_back({"adamw:copies",
                  "adamw[copies] " + sh + (with32 ? " fp32 and 16-bit" : " 16-bit") +
                      (rounded ? " grad rounded" : ""),
                  kTolElem, kTolElem, [n, sd, with32, rounded](Arena& a) {
                    Outputs o;
                    for (sw::DType dt : {sw::DType::BF16, sw::DType::F16}) {
                      Rng r(sd + 9);
                      const Vec p0 = r.normal(n), m0 = r.normal(n, 0.1f),
                                v0 = r.uniform(n, 0.f, 0.01f), g = r.normal(n);
                      float *p = a.up(p0), *m = a.up(m0), *v = a.up(v0);
                      float *pr = a.up(p0), *mr = a.up(m0), *vr = a.up(v0);
                      const float* pg = a.up(g);
                      const sw::DType gdt = !rounded              ? sw::DType::F32
                                            : dt == sw::DType::BF16 ? sw::DType::F16
                                                                    : sw::DType::BF16;
                      float* pgr = a.up(g);  // the reference's gradient: rounded first
                      if (rounded) a.ops().round_to(gdt, pgr, n);
                      float* c32 = with32 ? a.up(Vec(n, NAN)) : nullptr;
                      float* r32 = a.up(Vec(n, NAN));
                      uint16_t *c16 = up16(a, n), *r16 = up16(a, n);
                      a.ops().adamw_copies(p, pg, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5,
                                           0.5f, dt, c32, c16, gdt);
                      a.ops().adamw(pr, pgr, mr, vr, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.5f);
                      if (rounded) {  // the gradient itself only read
                        put(o, "grad after" + std::string(" ") + sw::dtype_name(dt), a.down(pg, n));
                        put(o, "grad" + std::string(" ") + sw::dtype_name(dt), g);
                      }
                      a.ops().round_copy_lp(dt, r32, r16, pr, n);
                      const std::string d = std::string(" ") + sw::dtype_name(dt);
                      put(o, "param" + d, a.down(p, n));
                      put(o, "param ref" + d, a.down(pr, n));
                      put(o, "m" + d, a.down(m, n));
                      put(o, "m ref" + d, a.down(mr, n));
                      put(o, "16-bit" + d, down16(a, c16, n, dt));
                      put(o, "16-bit ref" + d, down16(a, r16, n, dt));
                      if (with32) {
                        put(o, "fp32 copy" + d, a.down(c32, n));
                        put(o, "fp32 copy ref" + d, a.down(r32, n));
                      }
                    }
                    return o;
                  }});
  }
  {  // sum_squares over several of the backends' chunks
    const size_t n = 300007;
    cs.push_back({"sums_of_squares:one", "sums_of_squares[one] n=300007", kTolElem, kTolElem,
                  [n](Arena& a) {
                    Rng r(77);
                    const double s = a.ops().sum_squares(a.up(r.normal(n)), n);
                    return Outputs{{"sum", {s}}};
                  }});
  }
  // Each row's first gate far out, alternately -95 and +95 (past -88.7, where e^-g overflows
  // a float; the CPU clamps exp's argument to [-80, 80]).
  const auto extreme_gates = [](Vec gu, int N, int F) {
    for (int n = 0; n < N; ++n) gu[size_t(n) * 2 * F] = n % 2 ? 95.f : -95.f;
    return gu;
  };
  for (const auto& [N, F] : {std::pair{7, 45}, std::pair{1, 1}, std::pair{33, 130}}) {
    const uint64_t sd = seed++;
    const std::string sh = shape({{"N", N}, {"F", F}});
    const size_t NF = size_t(N) * F;
    cs.push_back({"swiglu_forward:f32", "swiglu_forward[f32] " + sh, kTolElem, kTolElem,
                  [N = N, F = F, sd, NF, extreme_gates](Arena& a) {
                    Rng r(sd);
                    const Vec gu = extreme_gates(r.normal(2 * NF, 3.f), N, F);
                    float* out = a.up(Vec(NF));
                    a.ops().swiglu_forward(out, a.up(gu), N, int(NF / N));
                    Outputs o;
                    put(o, "out", a.down(out, NF));
                    return o;
                  }});
    cs.push_back({"swiglu_backward:add", "swiglu_backward[add] " + sh, kTolElem, kTolElem,
                  [N = N, F = F, sd, NF, extreme_gates](Arena& a) {
                    Rng r(sd + 1);
                    const Vec gu = extreme_gates(r.normal(2 * NF, 3.f), N, F), dy = r.normal(NF),
                              dgu0 = r.normal(2 * NF);
                    float* dgu = a.up(dgu0);
                    a.ops().swiglu_backward(dgu, a.up(dy), a.up(gu), N, int(NF / N));
                    Outputs o;
                    put(o, "dgu", a.down(dgu, 2 * NF));
                    return o;
                  }});
    cs.push_back({"swiglu_forward:out16", "swiglu_forward[out16] " + sh, kTolRound16, kTolRound16,
                  [N = N, sd, NF](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 3);
                    const float* gu = a.up(r.normal(2 * NF, 3.f));
                    uint16_t* lp = up16(a, NF);
                    uint16_t* ref = up16(a, NF);
                    float* f = a.up(Vec(NF, NAN));
                    a.ops().swiglu_forward(lp, gu, N, int(NF / N));
                    a.ops().swiglu_forward(f, gu, N, int(NF / N));
                    a.ops().narrow(dt, f, ref, NF);
                    put(o, "lp", down16(a, lp, NF, dt));
                    put(o, "ref", down16(a, ref, NF, dt));
                    // gu 16-bit (a product's output kept in the compute precision), against
                    // the fp32 op on its widened values
                    uint16_t* gu16 = up16(a, 2 * NF);
                    a.ops().narrow(dt, gu, gu16, 2 * NF);
                    float* guw = a.up(Vec(2 * NF, NAN));
                    a.ops().widen(dt, gu16, guw, 2 * NF);
                    a.ops().swiglu_forward(lp, gu16, N, int(NF / N));
                    a.ops().swiglu_forward(f, guw, N, int(NF / N));
                    a.ops().narrow(dt, f, ref, NF);
                    put(o, "lp gu16", down16(a, lp, NF, dt));
                    put(o, "ref gu16", down16(a, ref, NF, dt));
                    return o;
                  }});
    cs.push_back({"swiglu_backward:set", "swiglu_backward[set] " + sh, kTolElem, kTolElem,
                  [N = N, sd, NF](Arena& a) {
                    Rng r(sd + 2);
                    const Vec gu = r.normal(2 * NF, 3.f), dy = r.normal(NF);
                    float* dgu = a.up(Vec(2 * NF, NAN));
                    float* dgu0 = a.up(Vec(2 * NF, 0.f));
                    const float *pdy = a.up(dy), *pgu = a.up(gu);
                    a.ops().swiglu_backward(sw::GradIn::set(dgu), pdy, pgu, N, int(NF / N));
                    a.ops().swiglu_backward(dgu0, pdy, pgu, N, int(NF / N));
                    Outputs o;
                    put(o, "set", a.down(dgu, 2 * NF));
                    put(o, "acc0", a.down(dgu0, 2 * NF));
                    return o;
                  }});
    cs.push_back({"swiglu_backward:lp", "swiglu_backward[lp] " + sh, kTolRound16, kTolRound16,
                  [N = N, sd, NF](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 5);
                    const Vec gu = r.normal(2 * NF, 3.f), dy = r.normal(NF);
                    const float *pdy = a.up(dy), *pgu = a.up(gu);
                    uint16_t* lp = up16(a, 2 * NF);
                    uint16_t* ref = up16(a, 2 * NF);
                    float* f = a.up(Vec(2 * NF, NAN));
                    a.ops().swiglu_backward(sw::GradIn::set(nullptr, lp), pdy, pgu, N, int(NF / N));
                    a.ops().swiglu_backward(sw::GradIn::set(f), pdy, pgu, N, int(NF / N));
                    a.ops().narrow(dt, f, ref, 2 * NF);
                    put(o, "lp", down16(a, lp, 2 * NF, dt));
                    put(o, "ref", down16(a, ref, 2 * NF, dt));
                    // gu 16-bit, against the fp32 op on its widened values
                    uint16_t* gu16 = up16(a, 2 * NF);
                    a.ops().narrow(dt, pgu, gu16, 2 * NF);
                    float* guw = a.up(Vec(2 * NF, NAN));
                    a.ops().widen(dt, gu16, guw, 2 * NF);
                    a.ops().swiglu_backward(sw::GradIn::set(nullptr, lp), pdy, gu16, N,
                                            int(NF / N));
                    a.ops().swiglu_backward(sw::GradIn::set(f), pdy, guw, N, int(NF / N));
                    a.ops().narrow(dt, f, ref, 2 * NF);
                    put(o, "lp gu16", down16(a, lp, 2 * NF, dt));
                    put(o, "ref gu16", down16(a, ref, 2 * NF, dt));
                    // dout 16-bit too (the down projection's input gradient kept 16-bit), and
                    // dout 16-bit with gu fp32
                    const Narrowed16 dy16(a, pdy, NF);
                    a.ops().swiglu_backward(sw::GradIn::set(nullptr, lp), dy16.lp, gu16, N,
                                            int(NF / N));
                    a.ops().swiglu_backward(sw::GradIn::set(f), dy16.wide, guw, N, int(NF / N));
                    a.ops().narrow(dt, f, ref, 2 * NF);
                    put(o, "lp dy16", down16(a, lp, 2 * NF, dt));
                    put(o, "ref dy16", down16(a, ref, 2 * NF, dt));
                    a.ops().swiglu_backward(sw::GradIn::set(nullptr, lp), dy16.lp, pgu, N,
                                            int(NF / N));
                    a.ops().swiglu_backward(sw::GradIn::set(f), dy16.wide, pgu, N, int(NF / N));
                    a.ops().narrow(dt, f, ref, 2 * NF);
                    put(o, "lp gu32 dy16", down16(a, lp, 2 * NF, dt));
                    put(o, "ref gu32 dy16", down16(a, ref, 2 * NF, dt));
                    return o;
                  }});
  }

  // RoPE and attention share their shapes: grouped heads, T = 1, T = 7, tiles crossed, odd hd;
  // T = 300 and 530 cross the 256-key softmax tiles of the forward.
  struct At { int B, T, H, KVH, hd; };
  for (const At s : {At{2, 7, 4, 2, 16}, At{1, 1, 2, 1, 8}, At{1, 70, 3, 1, 24},
                     At{2, 33, 4, 4, 64}, At{1, 40, 6, 2, 80}, At{1, 9, 2, 2, 128},
                     At{1, 300, 2, 1, 16}, At{1, 530, 4, 2, 8}}) {
    const uint64_t sd = seed++;
    const std::string sh =
        shape({{"B", s.B}, {"T", s.T}, {"H", s.H}, {"KVH", s.KVH}, {"hd", s.hd}});
    const size_t nqkv = size_t(s.B) * s.T * (s.H + 2 * s.KVH) * s.hd;
    const size_t nout = size_t(s.B) * s.T * s.H * s.hd, nlse = size_t(s.B) * s.H * s.T;
    // (forward with Llama 3.1's scaling, its three frequency regions inside hd 8 / 16, so the
    // backends' tables share rope_inv_freq; backward plain)
    sw::RopeSpec llama3_rope(500000.f);
    llama3_rope.llama3 = true;
    llama3_rope.original_max_pos = 64;
    for (int bwd = 0; bwd < 2; ++bwd)
      cs.push_back({bwd ? "rope_backward:f32" : "rope_forward:f32",
                    std::string(bwd ? "rope_backward[f32] " : "rope_forward[f32] ") + sh,
                    kTolElem, kTolElem,
                    [s, sd, nqkv, bwd, llama3_rope](Arena& a) {
                      Rng r(sd + 10 * bwd);
                      float* x = a.up(r.normal(nqkv));
                      if (bwd)
                        a.ops().rope_backward(x, x, s.B, s.T, s.H, s.KVH, s.hd, 10000.f);
                      else
                        a.ops().rope_forward(x, x, s.B, s.T, s.H, s.KVH, s.hd, llama3_rope);
                      Outputs o;
                      put(o, "qkv", a.down(x, nqkv));
                      return o;
                    }});
    cs.push_back({"rope_backward:out16", "rope_backward[out16] " + sh, kTolRound16, kTolRound16,
                  [s, sd, nqkv](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 40);
                    const Vec d = r.normal(nqkv);
                    const float* pd = a.up(d);
                    float* f = a.up(d);
                    uint16_t* lp = up16(a, nqkv);
                    uint16_t* ref = up16(a, nqkv);
                    a.ops().rope_backward(lp, pd, s.B, s.T, s.H, s.KVH, s.hd, 10000.f);
                    a.ops().rope_backward(f, f, s.B, s.T, s.H, s.KVH, s.hd, 10000.f);
                    a.ops().narrow(dt, f, ref, nqkv);
                    put(o, "lp", down16(a, lp, nqkv, dt));
                    put(o, "ref", down16(a, ref, nqkv, dt));
                    put(o, "src", a.down(pd, nqkv));  // only read
                    put(o, "src0", d);
                    // From 16 bits in place (the Llama's dqkv as attention writes it), against
                    // the fp32 op on the widened values
                    uint16_t* d16 = up16(a, nqkv);
                    a.ops().narrow(dt, pd, d16, nqkv);
                    a.ops().widen(dt, d16, f, nqkv);
                    a.ops().rope_backward(d16, d16, s.B, s.T, s.H, s.KVH, s.hd, 10000.f);
                    a.ops().rope_backward(f, f, s.B, s.T, s.H, s.KVH, s.hd, 10000.f);
                    a.ops().narrow(dt, f, ref, nqkv);
                    put(o, "lp in place", down16(a, d16, nqkv, dt));
                    put(o, "ref in place", down16(a, ref, nqkv, dt));
                    return o;
                  }});
    cs.push_back({"attention_forward:f32", "attention_forward[f32] " + sh, kTolAttn, kTolAttnLowp,
                  [s, sd, nqkv, nout, nlse](Arena& a) {
                    Rng r(sd + 20);
                    const Vec qkv = r.normal(nqkv, 1.5f);
                    float* out = a.up(Vec(nout));
                    float* lse = a.up(Vec(nlse));
                    a.ops().attention_forward(out, lse, a.up(qkv), s.B, s.T, s.H, s.KVH, s.hd);
                    Outputs o;
                    put(o, "out", a.down(out, nout));
                    put(o, "lse", a.down(lse, nlse));
                    return o;
                  }});
    cs.push_back({"attention_backward:add", "attention_backward[add] " + sh, kTolAttn, kTolAttnLowp,
                  [s, sd, nqkv, nout](Arena& a) {
                    Rng r(sd + 30);
                    const Vec qkv = r.normal(nqkv, 1.5f), dy = r.normal(nout),
                              dqkv0 = r.normal(nqkv);
                    Vec out, lse;
                    attention_host(qkv, s.B, s.T, s.H, s.KVH, s.hd, out, lse);
                    float* dqkv = a.up(dqkv0);
                    a.ops().attention_backward(dqkv, a.up(dy), a.up(qkv), a.up(out), a.up(lse),
                                               s.B, s.T, s.H, s.KVH, s.hd);
                    Outputs o;
                    put(o, "dqkv", a.down(dqkv, nqkv));
                    return o;
                  }});
    cs.push_back({"attention_backward:set", "attention_backward[set] " + sh, kTolAttn,
                  kTolAttnLowp, [s, sd, nqkv, nout](Arena& a) {
                    Rng r(sd + 40);
                    const Vec qkv = r.normal(nqkv, 1.5f), dy = r.normal(nout);
                    Vec out, lse;
                    attention_host(qkv, s.B, s.T, s.H, s.KVH, s.hd, out, lse);
                    float* dqkv = a.up(Vec(nqkv, NAN));
                    float* dqkv0 = a.up(Vec(nqkv, 0.f));
                    const float *pdy = a.up(dy), *pq = a.up(qkv), *po = a.up(out), *pl = a.up(lse);
                    a.ops().attention_backward(sw::GradIn::set(dqkv), pdy, pq, po, pl, s.B, s.T,
                                               s.H, s.KVH, s.hd);
                    a.ops().attention_backward(dqkv0, pdy, pq, po, pl, s.B, s.T, s.H, s.KVH, s.hd);
                    Outputs o;
                    put(o, "set", a.down(dqkv, nqkv));
                    put(o, "acc0", a.down(dqkv0, nqkv));
                    return o;
                  }});
    // 16-bit qkv and output (BF16 / F16 Ops): against the fp32 ops on the widened values.
    cs.push_back({"rope_forward:out16", "rope_forward[out16] " + sh, kTolRound16, kTolRound16,
                  [s, sd, nqkv](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 50);
                    const Vec q = r.normal(nqkv);
                    const float* pq = a.up(q);
                    float* f = a.up(q);
                    uint16_t* lp = up16(a, nqkv);
                    uint16_t* ref = up16(a, nqkv);
                    a.ops().rope_forward(lp, pq, s.B, s.T, s.H, s.KVH, s.hd, 500000.f);
                    a.ops().rope_forward(f, f, s.B, s.T, s.H, s.KVH, s.hd, 500000.f);
                    a.ops().narrow(dt, f, ref, nqkv);
                    put(o, "lp", down16(a, lp, nqkv, dt));
                    put(o, "ref", down16(a, ref, nqkv, dt));
                    put(o, "src", a.down(pq, nqkv));  // only read
                    put(o, "src0", q);
                    // From 16 bits in place (the Llama's qkv product kept 16-bit), against the
                    // fp32 op on the widened values
                    uint16_t* q16 = up16(a, nqkv);
                    a.ops().narrow(dt, pq, q16, nqkv);
                    a.ops().widen(dt, q16, f, nqkv);
                    a.ops().rope_forward(q16, q16, s.B, s.T, s.H, s.KVH, s.hd, 500000.f);
                    a.ops().rope_forward(f, f, s.B, s.T, s.H, s.KVH, s.hd, 500000.f);
                    a.ops().narrow(dt, f, ref, nqkv);
                    put(o, "lp in place", down16(a, q16, nqkv, dt));
                    put(o, "ref in place", down16(a, ref, nqkv, dt));
                    return o;
                  }});
    cs.push_back({"attention_forward:lp", "attention_forward[lp] " + sh, kTolRound16,
                  kTolAttnLowp, [s, sd, nqkv, nout, nlse](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 60);
                    const float* pq = a.up(r.normal(nqkv, 1.5f));
                    uint16_t* q16 = up16(a, nqkv);
                    a.ops().narrow(dt, pq, q16, nqkv);
                    float* qw = a.up(Vec(nqkv, NAN));
                    a.ops().widen(dt, q16, qw, nqkv);
                    uint16_t* lp = up16(a, nout);
                    uint16_t* ref = up16(a, nout);
                    float* f = a.up(Vec(nout, NAN));
                    float *lse = a.up(Vec(nlse, NAN)), *lser = a.up(Vec(nlse, NAN));
                    a.ops().attention_forward(lp, lse, q16, s.B, s.T, s.H, s.KVH, s.hd);
                    a.ops().attention_forward(f, lser, qw, s.B, s.T, s.H, s.KVH, s.hd);
                    a.ops().narrow(dt, f, ref, nout);
                    put(o, "lp", down16(a, lp, nout, dt));
                    put(o, "ref", down16(a, ref, nout, dt));
                    put(o, "lse", a.down(lse, nlse));
                    put(o, "lse_ref", a.down(lser, nlse));
                    return o;
                  }});
    // Inputs on the 16-bit grid (O rounded, so D too) put a bf16 dS near a rounding tie now and
    // then: one flip between two backends' fp32 orders costs ~1e-8 (test_lowp_twin's model in
    // the sanitizer build: 1.3e-8 at T = 70, H = 3, hd = 24), hence 1e-7 across backends;
    // paired_forms_exact still holds lp == ref bit for bit on each.
    cs.push_back({"attention_backward:lp", "attention_backward[lp] " + sh, 1e-7,
                  kTolAttnLowp, [s, sd, nqkv, nout](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 70);
                    const Vec qkv = r.normal(nqkv, 1.5f), dy = r.normal(nout);
                    Vec out, lse;
                    attention_host(qkv, s.B, s.T, s.H, s.KVH, s.hd, out, lse);
                    const float *pq = a.up(qkv), *po = a.up(out), *pl = a.up(lse), *pdy = a.up(dy);
                    uint16_t* q16 = up16(a, nqkv);
                    uint16_t* o16 = up16(a, nout);
                    a.ops().narrow(dt, pq, q16, nqkv);
                    a.ops().narrow(dt, po, o16, nout);
                    float* qw = a.up(Vec(nqkv, NAN));
                    float* ow = a.up(Vec(nout, NAN));
                    a.ops().widen(dt, q16, qw, nqkv);
                    a.ops().widen(dt, o16, ow, nout);
                    float* d = a.up(Vec(nqkv, NAN));
                    float* dr = a.up(Vec(nqkv, NAN));
                    float* d2 = a.up(Vec(nqkv, NAN));
                    uint16_t* d16 = up16(a, nqkv);
                    uint16_t* dr16 = up16(a, nqkv);
                    a.ops().attention_backward(sw::GradIn::set(d, nullptr), pdy, q16, o16, pl, s.B,
                                               s.T, s.H, s.KVH, s.hd);
                    a.ops().attention_backward(sw::GradIn::set(dr), pdy, qw, ow, pl, s.B, s.T, s.H,
                                               s.KVH, s.hd);
                    // with the 16-bit form too: the same fp32 gradient, and its narrowing
                    a.ops().attention_backward(sw::GradIn::set(d2, d16), pdy, q16, o16, pl, s.B,
                                               s.T, s.H, s.KVH, s.hd);
                    a.ops().narrow(dt, dr, dr16, nqkv);
                    put(o, "lp", a.down(d, nqkv));
                    put(o, "ref", a.down(dr, nqkv));
                    put(o, "lp_both", a.down(d2, nqkv));
                    put(o, "ref_again", a.down(dr, nqkv));
                    put(o, "lp16", down16(a, d16, nqkv, dt));
                    put(o, "ref16", down16(a, dr16, nqkv, dt));
                    // dout 16-bit (the output projection's input gradient kept 16-bit) and the
                    // 16-bit dqkv alone (the Llama's), against the fp32 op on widened dout
                    const Narrowed16 dy16(a, pdy, nout);
                    a.ops().attention_backward(sw::GradIn::set(nullptr, d16), dy16.lp, q16, o16, pl,
                                               s.B, s.T, s.H, s.KVH, s.hd);
                    a.ops().attention_backward(sw::GradIn::set(dr), dy16.wide, qw, ow, pl, s.B, s.T,
                                               s.H, s.KVH, s.hd);
                    a.ops().narrow(dt, dr, dr16, nqkv);
                    put(o, "lp16 dy16", down16(a, d16, nqkv, dt));
                    put(o, "ref16 dy16", down16(a, dr16, nqkv, dt));
                    return o;
                  }});
  }

  // Fused LM head: ignored rows, loss only and with gradients, several row chunks (CUDA's
  // are 4096 rows: kernels/cuda/workspace.h; the CPU's 512).
  struct X { int N, C, V; bool grad; };
  for (const X x : {X{13, 24, 67, true}, X{13, 24, 67, false}, X{1, 7, 3, true},
                    X{4200, 16, 37, true}}) {
    const uint64_t sd = seed++;
    cs.push_back({"lmhead_xent",
                  "lmhead_xent " + shape({{"N", x.N}, {"C", x.C}, {"V", x.V}, {"grad", x.grad}}),
                  kTolMat, kTolMatLowp, [x, sd](Arena& a) {
                    Rng r(sd);
                    const Vec xs = r.normal(size_t(x.N) * x.C), w = r.normal(size_t(x.V) * x.C, 0.5f);
                    IVec t = r.ints(x.N, 0, x.V);
                    for (size_t i = 3; i < t.size(); i += 5) t[i] = -1;  // ignored rows
                    const Vec dx0 = r.normal(xs.size()), dw0 = r.normal(w.size());
                    float* loss = a.up(Vec(x.N));
                    float* dx = a.up(dx0);
                    float* dw = a.up(dw0);
                    const double total =
                        a.ops().lmhead_xent(loss, x.grad ? dx : nullptr, x.grad ? dw : nullptr,
                                            a.up(xs), a.up(w), a.up(t), x.N, x.C, x.V,
                                            1.f / x.N);
                    Outputs o;
                    o.push_back({"total", {total}});
                    put(o, "loss", a.down(loss, x.N));
                    put(o, "dx", a.down(dx, dx0.size()));
                    put(o, "dw", a.down(dw, dw0.size()));
                    return o;
                  }});
    // The weight 16-bit only, or with both forms (a unit's LM head with its 16-bit copy), in
    // BF16 / F16: bit for bit the op on the rounded fp32 weight (the products round it to
    // those values); pairs for paired_forms_exact.
    for (int wf = 1; wf < 3; ++wf)
      cs.push_back({"lmhead_xent",
                    "lmhead_xent " + weight_form(wf) + " " +
                        shape({{"N", x.N}, {"C", x.C}, {"V", x.V}, {"grad", x.grad}}),
                    kTolMat, kTolMatLowp, [x, sd, wf](Arena& a) {
                      Outputs o;
                      if (a.ops().compute() == sw::DType::F32) return o;
                      Rng r(sd + 50);
                      const Vec xs = r.normal(size_t(x.N) * x.C),
                                w = r.normal(size_t(x.V) * x.C, 0.5f);
                      IVec t = r.ints(x.N, 0, x.V);
                      for (size_t i = 3; i < t.size(); i += 5) t[i] = -1;
                      const Vec dx0 = r.normal(xs.size()), dw0 = r.normal(w.size());
                      const WeightForms pw(a, w, wf);
                      const float* px = a.up(xs);
                      const int32_t* pt = a.up(t);
                      float *loss = a.up(Vec(x.N)), *lr = a.up(Vec(x.N));
                      float *dx = a.up(dx0), *dxr = a.up(dx0), *dw = a.up(dw0), *dwr = a.up(dw0);
                      const double tot = a.ops().lmhead_xent(
                          loss, x.grad ? dx : nullptr, x.grad ? dw : nullptr, px, pw.operand, pt,
                          x.N, x.C, x.V, 1.f / x.N);
                      const double ref = a.ops().lmhead_xent(
                          lr, x.grad ? dxr : nullptr, x.grad ? dwr : nullptr, px, pw.rounded, pt,
                          x.N, x.C, x.V, 1.f / x.N);
                      o.push_back({"total", {tot}});
                      o.push_back({"total_ref", {ref}});
                      put(o, "loss", a.down(loss, x.N));
                      put(o, "loss_ref", a.down(lr, x.N));
                      put(o, "dx", a.down(dx, dx0.size()));
                      put(o, "dx_ref", a.down(dxr, dx0.size()));
                      put(o, "dw", a.down(dw, dw0.size()));
                      put(o, "dw_ref", a.down(dwr, dw0.size()));
                      return o;
                    }});
    // The total added to a device double (the engine's per-micro-step loss), twice; the
    // per-row losses not asked for.
    cs.push_back({"lmhead_xent_into",
                  "lmhead_xent_into " + shape({{"N", x.N}, {"C", x.C}, {"V", x.V}, {"grad", x.grad}}),
                  kTolMat, kTolMatLowp, [x, sd](Arena& a) {
                    Rng r(sd + 100);
                    const Vec xs = r.normal(size_t(x.N) * x.C), w = r.normal(size_t(x.V) * x.C, 0.5f);
                    IVec t = r.ints(x.N, 0, x.V);
                    for (size_t i = 2; i < t.size(); i += 4) t[i] = -1;
                    const Vec dx0 = r.normal(xs.size()), dw0 = r.normal(w.size());
                    float* dx = a.up(dx0);
                    float* dw = a.up(dw0);
                    double* total = a.up(std::vector<double>{2.5});
                    float* xd = a.up(xs);
                    float* wd = a.up(w);
                    int32_t* td = a.up(t);
                    for (int k = 0; k < 2; ++k)
                      a.ops().lmhead_xent_into(total, nullptr, x.grad ? dx : nullptr,
                                               x.grad ? dw : nullptr, xd, wd, td, x.N, x.C, x.V,
                                               0.5f / x.N);
                    Outputs o;
                    o.push_back({"total", a.down(total, 1)});
                    put(o, "dx", a.down(dx, dx0.size()));
                    put(o, "dw", a.down(dw, dw0.size()));
                    return o;
                  }});
  }

  // Tensor parallelism: a vocabulary shard [v_lo, v_lo + V) of a table of Vt rows (tokens and
  // targets outside it, ignored targets), positions of a run of rows starting mid-sequence
  // and wrapping past T.
  struct VE { int N, C, V, Vt, v_lo; };
  for (const VE e : {VE{21, 45, 5, 15, 5}, VE{1, 64, 3, 3, 0}, VE{300, 300, 41, 100, 59}}) {
    const uint64_t sd = seed++;
    const std::string sh =
        shape({{"N", e.N}, {"C", e.C}, {"V", e.V}, {"Vt", e.Vt}, {"v_lo", e.v_lo}});
    const size_t no = size_t(e.N) * e.C, nw = size_t(e.V) * e.C;
    cs.push_back({"vocab_embedding_forward:f32", "vocab_embedding_forward[f32] " + sh, kTolElem,
                  kTolElem, [e, sd, no](Arena& a) {
                    Rng r(sd);
                    const IVec tok = r.ints(size_t(e.N), 0, e.Vt);
                    const Vec wte = r.normal(size_t(e.V) * e.C);
                    float* out = a.up(Vec(no, NAN));  // written, never read
                    a.ops().vocab_embedding_forward(out, a.up(tok), a.up(wte), e.v_lo, e.N, e.C,
                                                    e.V);
                    Outputs o;
                    put(o, "out", a.down(out, no));
                    return o;
                  }});
    // The table 16-bit only against the op on its widened values, and the fp32 form as an
    // Operand against the plain pointer: pairs, bit for bit on each backend (a table with both
    // forms is read 16-bit on CUDA and the simulated device, fp32 on the CPU: not compared).
    cs.push_back({"vocab_embedding_forward:lp", "vocab_embedding_forward[lp] " + sh, kTolElem,
                  kTolElem, [e, sd, no, nw](Arena& a) {
                    Outputs o;
                    const sw::DType dt = a.ops().compute();
                    if (dt == sw::DType::F32) return o;
                    Rng r(sd + 500);
                    const IVec tok = r.ints(size_t(e.N), 0, e.Vt);
                    const Vec wte = r.normal(nw);
                    const float* pw = a.up(wte);
                    const Narrowed16 w16(a, pw, nw);
                    const int32_t* pt = a.up(tok);
                    float *lp = a.up(Vec(no, NAN)), *ref = a.up(Vec(no, NAN));
                    float *f = a.up(Vec(no, NAN)), *fr = a.up(Vec(no, NAN));
                    a.ops().vocab_embedding_forward(lp, pt, w16.lp, e.v_lo, e.N, e.C, e.V);
                    a.ops().vocab_embedding_forward(ref, pt, w16.wide, e.v_lo, e.N, e.C, e.V);
                    a.ops().vocab_embedding_forward(f, pt, sw::Operand(pw), e.v_lo, e.N, e.C,
                                                    e.V);
                    a.ops().vocab_embedding_forward(fr, pt, pw, e.v_lo, e.N, e.C, e.V);
                    put(o, "lp", a.down(lp, no));
                    put(o, "ref", a.down(ref, no));
                    put(o, "f32", a.down(f, no));
                    put(o, "f32 ref", a.down(fr, no));
                    return o;
                  }});
    cs.push_back({"vocab_embedding_backward", "vocab_embedding_backward " + sh, kTolElem,
                  kTolElem, [e, sd, no, nw](Arena& a) {
                    Rng r(sd + 1000);
                    const IVec tok = r.ints(size_t(e.N), 0, e.Vt);
                    const Vec dy = r.normal(no), dwte0 = r.normal(nw);
                    float* dwte = a.up(dwte0);
                    a.ops().vocab_embedding_backward(dwte, a.up(dy), a.up(tok), e.v_lo, e.N, e.C,
                                                     e.V);
                    Outputs o;
                    put(o, "dwte", a.down(dwte, nw));
                    return o;
                  }});
  }
  struct P { int rows, T, C; long row_lo; };
  for (const P q : {P{17, 7, 45, 5}, P{3, 8, 64, 0}, P{300, 33, 96, 1000003}}) {
    const uint64_t sd = seed++;
    const std::string sh =
        shape({{"rows", q.rows}, {"T", q.T}, {"C", q.C}, {"row_lo", q.row_lo}});
    const size_t no = size_t(q.rows) * q.C, np = size_t(q.T) * q.C;
    cs.push_back({"position_forward", "position_forward " + sh, kTolElem, kTolElem,
                  [q, sd, no, np](Arena& a) {
                    Rng r(sd);
                    const Vec out0 = r.normal(no), wpe = r.normal(np);
                    float* out = a.up(out0);
                    a.ops().position_forward(out, a.up(wpe), q.row_lo, q.rows, q.T, q.C);
                    Outputs o;
                    put(o, "out", a.down(out, no));
                    return o;
                  }});
    cs.push_back({"position_backward", "position_backward " + sh, kTolElem, kTolElem,
                  [q, sd, no, np](Arena& a) {
                    Rng r(sd + 1000);
                    const Vec dy = r.normal(no), dwpe0 = r.normal(np);
                    float* dwpe = a.up(dwpe0);
                    a.ops().position_backward(dwpe, a.up(dy), q.row_lo, q.rows, q.T, q.C);
                    Outputs o;
                    put(o, "dwpe", a.down(dwpe, np));
                    return o;
                  }});
  }

  // The vocabulary-parallel cross-entropy: this shard is the middle third [V, 2V) of 3V
  // targets (ignored rows: -1); V odd and a multiple of 4 (CUDA's one- and four-wide row
  // kernels), more rows than one chunk (CUDA's 4096). lse comes from the host (the shard's
  // own log-sum-exp in double, plus 0.7 for the others'), so both backends' backward passes
  // read the same values.
  struct XS { int N, C, V; };
  const auto shard_targets = [](Rng& r, int N, int V) {
    IVec t = r.ints(size_t(N), 0, 3 * V);
    for (size_t i = 3; i < t.size(); i += 5) t[i] = -1;
    return t;
  };
  const auto host_lse = [](const Vec& h, const Vec& w, int N, int C, int V) {
    Vec lse(static_cast<size_t>(N));
    std::vector<double> z(static_cast<size_t>(V));
    for (int n = 0; n < N; ++n) {
      double m = -INFINITY;
      for (int v = 0; v < V; ++v) {
        double d = 0;
        for (int c = 0; c < C; ++c) d += double(h[size_t(n) * C + c]) * w[size_t(v) * C + c];
        z[size_t(v)] = d;
        m = std::max(m, d);
      }
      double s = 0;
      for (int v = 0; v < V; ++v) s += std::exp(z[size_t(v)] - m);
      lse[size_t(n)] = static_cast<float>(m + std::log(s) + 0.7);
    }
    return lse;
  };
  for (const XS x : {XS{13, 24, 67}, XS{37, 16, 64}, XS{1, 7, 3}, XS{4200, 16, 37}}) {
    const uint64_t sd = seed++;
    const std::string sh = shape({{"N", x.N}, {"C", x.C}, {"V", x.V}});
    const size_t nh = size_t(x.N) * x.C, nw = size_t(x.V) * x.C;
    cs.push_back({"xent_shard_stats", "xent_shard_stats " + sh, kTolMat, kTolMatLowp,
                  [x, sd, nh, nw, shard_targets](Arena& a) {
                    Rng r(sd);
                    const Vec h = r.normal(nh), w = r.normal(nw, 0.5f);
                    const IVec t = shard_targets(r, x.N, x.V);
                    float* st = a.up(Vec(size_t(x.N) * 3, NAN));  // written, never read
                    a.ops().xent_shard_stats(st, a.up(h), a.up(w), a.up(t), x.V, x.N, x.C, x.V);
                    const Vec sv = a.down(st, size_t(x.N) * 3);
                    Vec m(static_cast<size_t>(x.N)), s(m.size()), tl(m.size());
                    for (int n = 0; n < x.N; ++n)
                      m[n] = sv[3 * n], s[n] = sv[3 * n + 1], tl[n] = sv[3 * n + 2];
                    Outputs o;
                    put(o, "max", m);
                    put(o, "sumexp", s);
                    put(o, "target_logit", tl);
                    return o;
                  }});
    for (int set = 0; set < 2; ++set)
      cs.push_back({set ? "xent_shard_backward:set" : "xent_shard_backward:add",
                    std::string("xent_shard_backward[") + (set ? "set" : "add") + "] " + sh,
                    kTolMat, kTolMatLowp, [x, sd, nh, nw, set, shard_targets, host_lse](Arena& a) {
                      Rng r(sd + 100);
                      const Vec h = r.normal(nh), w = r.normal(nw, 0.5f);
                      const IVec t = shard_targets(r, x.N, x.V);
                      // (the starting gradients and grad_scale sized so that what the op adds
                      // is not lost beside what was there: a 1e-3 error in g fails every output)
                      const Vec dh0 = r.normal(nh, 0.1f), dw0 = r.normal(nw, 0.1f);
                      const Vec lse = host_lse(h, w, x.N, x.C, x.V);
                      const float *ph = a.up(h), *pw = a.up(w), *pl = a.up(lse);
                      const int32_t* pt = a.up(t);
                      const float gs = 0.5f;
                      Outputs o;
                      if (!set) {
                        float *dh = a.up(dh0), *dw = a.up(dw0);
                        a.ops().xent_shard_backward(dh, dw, ph, pw, pl, pt, x.V, x.N, x.C, x.V,
                                                    gs);
                        put(o, "dh", a.down(dh, nh));
                        put(o, "dw", a.down(dw, nw));
                        // dw alone, and dh alone
                        float *dw1 = a.up(dw0), *dh1 = a.up(dh0);
                        a.ops().xent_shard_backward(nullptr, dw1, ph, pw, pl, pt, x.V, x.N, x.C,
                                                    x.V, gs);
                        a.ops().xent_shard_backward(dh1, nullptr, ph, pw, pl, pt, x.V, x.N, x.C,
                                                    x.V, gs);
                        put(o, "dw only", a.down(dw1, nw));
                        put(o, "dh only", a.down(dh1, nh));
                        return o;
                      }
                      // dw written over NaN, and added into zeros: a pair.
                      float *dws = a.up(Vec(nw, NAN)), *dwz = a.up(Vec(nw, 0.f));
                      float *dh = a.up(dh0), *dhz = a.up(dh0);
                      a.ops().xent_shard_backward(dh, sw::GradOut(dws, true), ph, pw, pl, pt, x.V,
                                                  x.N, x.C, x.V, gs);
                      a.ops().xent_shard_backward(dhz, dwz, ph, pw, pl, pt, x.V, x.N, x.C, x.V,
                                                  gs);
                      put(o, "set", a.down(dws, nw));
                      put(o, "acc0", a.down(dwz, nw));
                      put(o, "dh", a.down(dh, nh));
                      put(o, "dh acc0", a.down(dhz, nh));
                      return o;
                    }});
    // BF16 / F16: the head's weight 16-bit only or in both forms against the op on the rounded
    // fp32 weight (the products round it to those values): pairs, bit for bit.
    cs.push_back({"xent_shard_backward:lp", "xent_shard w=lp/both " + sh, kTolMat, kTolMatLowp,
                  [x, sd, nh, nw, shard_targets, host_lse](Arena& a) {
                    Outputs o;
                    if (a.ops().compute() == sw::DType::F32) return o;
                    Rng r(sd + 200);
                    const Vec h = r.normal(nh), w = r.normal(nw, 0.5f);
                    const IVec t = shard_targets(r, x.N, x.V);
                    const Vec dh0 = r.normal(nh), dw0 = r.normal(nw);
                    const Vec lse = host_lse(h, w, x.N, x.C, x.V);
                    const float *ph = a.up(h), *pl = a.up(lse);
                    const int32_t* pt = a.up(t);
                    for (int wf = 1; wf < 3; ++wf) {
                      const WeightForms pw(a, w, wf);
                      const std::string f = weight_form(wf);
                      float *st = a.up(Vec(size_t(x.N) * 3)), *sr = a.up(Vec(size_t(x.N) * 3));
                      a.ops().xent_shard_stats(st, ph, pw.operand, pt, x.V, x.N, x.C, x.V);
                      a.ops().xent_shard_stats(sr, ph, pw.rounded, pt, x.V, x.N, x.C, x.V);
                      put(o, "stats " + f, a.down(st, size_t(x.N) * 3));
                      put(o, "stats ref " + f, a.down(sr, size_t(x.N) * 3));
                      float *dh = a.up(dh0), *dhr = a.up(dh0), *dw = a.up(dw0), *dwr = a.up(dw0);
                      a.ops().xent_shard_backward(dh, dw, ph, pw.operand, pl, pt, x.V, x.N, x.C,
                                                  x.V, 1.f / x.N);
                      a.ops().xent_shard_backward(dhr, dwr, ph, pw.rounded, pl, pt, x.V, x.N, x.C,
                                                  x.V, 1.f / x.N);
                      put(o, "dh " + f, a.down(dh, nh));
                      put(o, "dh ref " + f, a.down(dhr, nh));
                      put(o, "dw " + f, a.down(dw, nw));
                      put(o, "dw ref " + f, a.down(dwr, nw));
                    }
                    return o;
                  }});
  }
  // combine: t = 1, 2, 3 ranks' stats made on the host (a rank whose maximum is far below
  // the others', ignored rows), the total added into a device double twice.
  struct XC { int t, N; };
  for (const XC c : {XC{1, 13}, XC{2, 37}, XC{3, 1500}}) {
    const uint64_t sd = seed++;
    cs.push_back({"xent_shard_combine",
                  "xent_shard_combine " + shape({{"t", c.t}, {"N", c.N}}), kTolElem, kTolElem,
                  [c, sd](Arena& a) {
                    Rng r(sd);
                    Vec st(size_t(c.t) * c.N * 3);
                    for (int k = 0; k < c.t; ++k)
                      for (int n = 0; n < c.N; ++n) {
                        float* p = &st[(size_t(k) * c.N + n) * 3];
                        p[0] = static_cast<float>(3 * r.uniform()) - (n % 7 == k ? 40.f : 0.f);
                        p[1] = static_cast<float>(1 + 60 * r.uniform());
                        p[2] = n % 3 == k ? static_cast<float>(4 * r.uniform() - 2) : 0.f;
                      }
                    IVec t = r.ints(size_t(c.N), 0, 100);
                    for (size_t i = 2; i < t.size(); i += 4) t[i] = -1;
                    float *lse = a.up(Vec(size_t(c.N), NAN)), *loss = a.up(Vec(size_t(c.N), NAN));
                    double* total = a.up(std::vector<double>{2.5});
                    const float* ps = a.up(st);
                    const int32_t* pt = a.up(t);
                    for (int k = 0; k < 2; ++k)
                      a.ops().xent_shard_combine(total, lse, loss, ps, pt, c.t, c.N);
                    Outputs o;
                    o.push_back({"total", a.down(total, 1)});
                    put(o, "lse", a.down(lse, size_t(c.N)));
                    put(o, "loss", a.down(loss, size_t(c.N)));
                    return o;
                  }});
  }
  return cs;
}

// ---- Comparison ------------------------------------------------------------------------------

struct Result {
  std::string case_name, output;
  double nmse = 0, tol = 0;
  bool ok = false;
  std::string str() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "nmse=%.3e tol=%.1e", nmse, tol);
    return case_name + " [" + output + "]: " + buf + (ok ? " ok" : " FAIL");
  }
};

// sum (a - b)^2 / sum b^2 (b the reference); the plain sum of squares when b is all zero;
// infinity when sizes differ or a is not finite.
inline double nmse(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? num / den : num;
}

// Runs every case on both backends; one Result per output buffer. lowp: the candidate's
// matrix products are bf16 (use tol_lowp).
inline std::vector<Result> compare(const Backend& ref, const Backend& cand, bool lowp,
                                   const std::vector<OpCase>& cases) {
  std::vector<Result> out;
  for (const OpCase& c : cases) {
    Outputs r, k;
    {
      Arena ar(ref);
      r = c.run(ar);
    }
    {
      Arena ac(cand);
      k = c.run(ac);
    }
    const double tol = lowp ? c.tol_lowp : c.tol;
    for (size_t i = 0; i < r.size(); ++i) {
      Result res;
      res.case_name = c.name;
      res.output = r[i].name;
      res.tol = tol;
      res.nmse = i < k.size() && k[i].name == r[i].name ? nmse(k[i].v, r[i].v) : INFINITY;
      res.ok = res.nmse <= tol;
      out.push_back(res);
    }
  }
  return out;
}

// Runs every case twice on one backend; returns "case [output]" for each output whose bits
// differ between the runs.
inline std::vector<std::string> determinism(const Backend& be, const std::vector<OpCase>& cases) {
  std::vector<std::string> bad;
  for (const OpCase& c : cases) {
    Outputs o1, o2;
    {
      Arena a(be);
      o1 = c.run(a);
    }
    {
      Arena a(be);
      o2 = c.run(a);
    }
    for (size_t i = 0; i < o1.size(); ++i) {
      const bool same = i < o2.size() && o1[i].v.size() == o2[i].v.size() &&
                        std::memcmp(o1[i].v.data(), o2[i].v.data(),
                                    o1[i].v.size() * sizeof(double)) == 0;
      if (!same) bad.push_back(c.name + " [" + o1[i].name + "]");
    }
  }
  return bad;
}

// kernels/ops.h promises that the fused residual + norm forwards are bit-identical to
// residual_forward followed by the norm, on every backend. Returns the shapes where they differ.
inline std::vector<std::string> fused_norms_bitwise(const Backend& be) {
  std::vector<std::string> bad;
  struct S { int N, C; };
  for (const S s : {S{13, 77}, S{1, 1000}, S{300, 33}}) {
    const size_t NC = size_t(s.N) * s.C;
    Rng r(uint64_t(s.N) * 131 + s.C);
    const Vec x = r.normal(NC), y = r.normal(NC, 2.f), w = r.normal(s.C, 0.5f, 1.f),
              b = r.normal(s.C, 0.3f);
    for (int ln = 0; ln < 2; ++ln) {
      Arena a(be);
      const sw::Ops& ops = a.ops();
      float *px = a.up(x), *py = a.up(y), *pw = a.up(w), *pb = a.up(b);
      float *res1 = a.up(Vec(NC)), *out1 = a.up(Vec(NC)), *m1 = a.up(Vec(s.N)), *r1 = a.up(Vec(s.N));
      float *res2 = a.up(Vec(NC)), *out2 = a.up(Vec(NC)), *m2 = a.up(Vec(s.N)), *r2 = a.up(Vec(s.N));
      if (ln) {
        ops.layernorm_forward(out1, m1, r1, sw::NormIn::residual(res1, px, py), pw, pb, s.N, s.C);
        ops.residual_forward(res2, px, py, NC);
        ops.layernorm_forward(out2, m2, r2, res2, pw, pb, s.N, s.C);
      } else {
        ops.rmsnorm_forward(out1, r1, sw::NormIn::residual(res1, px, py), pw, s.N, s.C, 1e-5f);
        ops.residual_forward(res2, px, py, NC);
        ops.rmsnorm_forward(out2, r2, res2, pw, s.N, s.C, 1e-5f);
      }
      const auto eq = [&a](const float* p, const float* q, size_t n) {
        const Vec u = a.down(p, n), v = a.down(q, n);
        return std::memcmp(u.data(), v.data(), n * sizeof(float)) == 0;
      };
      const bool same = eq(res1, res2, NC) && eq(out1, out2, NC) && eq(r1, r2, s.N) &&
                        (!ln || eq(m1, m2, s.N));
      if (!same)
        bad.push_back(std::string(ln ? "layernorm" : "rmsnorm") + " " +
                      shape({{"N", s.N}, {"C", s.C}}));
    }
  }
  return bad;
}

// kernels/ops.h promises that a written gradient (set forms) gives the values of the same op
// adding into zeros (a zero may carry the other sign, which == ignores), round_copy those of
// copy + round_to (with a 16-bit copy: round_copy's and narrow's), each 16-bit input (lp
// forms; but a 16-bit dinp alone, which cuBLAS may sum in another order than the fp32 one)
// those of the fp32 input, each 16-bit output (out16 forms but the product's, likewise) narrow
// of the fp32 one, lmhead_xent with a 16-bit weight ("lmhead_xent w=lp / w=both") its results
// on the rounded fp32 one (the vocabulary-parallel embedding and cross-entropy likewise), and the sums of rounded values (adamw's copies with grad_dt) the
// results of rounded copies. Their cases return outputs in pairs: "set" and "acc0" (and dw /
// dw_acc, db / db_acc: parameter gradients accumulated by each), round_copy's result and
// copy + round_to's, "lp" and "ref". Returns "case [output]" for each pair that differs on
// this backend.
inline bool paired_form(const OpCase& c) {
  static const std::set<std::string> paired = {
      "gemm:lp", "linear_forward:lp", "linear_backward:set", "linear_backward:lp",
      "linear_backward:dinp16", "embedding_forward:lp", "layernorm_forward:out16",
      "layernorm_forward:residual_out16", "layernorm_backward:both", "rmsnorm_forward:out16",
      "rmsnorm_forward:residual_out16", "rmsnorm_backward:both", "gelu_forward:out16",
      "gelu_backward:set", "gelu_backward:lp", "swiglu_forward:out16", "swiglu_backward:set",
      "swiglu_backward:lp", "rope_forward:out16", "rope_backward:out16", "attention_forward:lp",
      "attention_backward:set", "attention_backward:lp", "adamw:copies",
      "sums_of_squares:rounded", "round_copy:f32", "round_copy:lp",
      "vocab_embedding_forward:lp", "xent_shard_backward:set", "xent_shard_backward:lp"};
  return paired.count(c.op) || c.name.rfind("lmhead_xent w=", 0) == 0;
}
inline std::vector<std::string> paired_forms_exact(const Backend& be,
                                                   const std::vector<OpCase>& cases) {
  std::vector<std::string> bad;
  for (const OpCase& c : cases) {
    if (!paired_form(c)) continue;
    // (the 16-bit dinp's first pair is a product's 16-bit output and its fp32 one narrowed:
    // cuBLAS may sum the two in other orders, so they are compared across backends only; its
    // dw and db pairs are exact)
    const size_t first = c.op == "linear_backward:dinp16" ? 2 : 0;
    Outputs o;
    {
      Arena a(be);
      o = c.run(a);
    }
    for (size_t i = first; i + 1 < o.size(); i += 2) {
      bool same = o[i].v.size() == o[i + 1].v.size();
      for (size_t j = 0; same && j < o[i].v.size(); ++j) same = o[i].v[j] == o[i + 1].v[j];
      if (!same) bad.push_back(c.name + " [" + o[i].name + "]");
    }
  }
  return bad;
}

// The ops the cases never exercise (empty when every op of sw::Ops is covered).
inline std::vector<std::string> uncovered(const std::vector<OpCase>& cases) {
  std::set<std::string> seen;
  for (const auto& c : cases) seen.insert(c.op);
  std::vector<std::string> missing;
  for (const auto& op : all_ops())
    if (!seen.count(op)) missing.push_back(op);
  return missing;
}

}  // namespace swtest::harness
