// DeferredWeightGrads (sharding/deferred_wgrad.h): the zero-bubble backward split. A tiny GPT-2
// and a tiny Llama (GQA), every block unit and the embedding / loss units, run backward through
// the decorator while it defers (I), then run(key) (W): dx of every call and every parameter
// gradient equal the plain backward's bit for bit (F32, BF16 and F16 Ops; 16-bit weight copies
// and the residual gradient's 16-bit form beside it; the packed products' per-matrix fallback).
// Two micro-batches I(0), I(1), W(0), W(1) equal B(0), B(1) with the first writer's
// GradOut::write honoured (gradient buffers start as NaN garbage). pending_bytes against the
// forms the units hand linear_backward, and against the tracker. A job left out is caught.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <tuple>
#include <vector>

#include "core/alloc.h"
#include "core/rng.h"
#include "sharding/deferred_wgrad.h"
#include "tests/common/forwarding_ops.h"
#include "tests/common/sim_device.h"
#include "tests/models/harness.h"

using namespace sw;
using swtest::Harness;
using swtest::TokenBatch;

namespace {

ModelConfig tiny_gpt2() {
  ModelConfig c;
  c.type = "gpt2";
  c.vocab_size = 40;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = 11;
  return c;
}

ModelConfig tiny_llama() {
  ModelConfig c;
  c.type = "llama";
  c.tie_embeddings = false;
  c.vocab_size = 40;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;  // GQA
  c.d_model = 16;
  c.d_ff = 24;
  c.seq_len = 16;
  c.rope_theta = 100.f;
  c.norm_eps = 1e-5f;
  return c;
}

// Counts, as the units call it (above the decorator), what a deferral must copy: the bytes of
// dout (N, OC) and, with dw, inp (N, C) in the forms given, of each linear_backward asking for
// a parameter gradient.
class Spy final : public swtest::ForwardingOps {
 public:
  using ForwardingOps::ForwardingOps;
  bool prefers_lp_operands() const override { return base_.prefers_lp_operands(); }
  mutable int64_t bytes = 0;
  mutable int calls = 0;
  void linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp, Operand w,
                       int N, int C, int OC) const override {
    if (dw || db) {
      ++calls;
      const auto per = [](Operand x) { return (x.f32 ? 4 : 0) + (x.lp ? 2 : 0); };
      bytes += int64_t{N} * OC * per(dout) + (dw ? int64_t{N} * C * per(inp) : 0);
    }
    base_.linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  }
};

// The gradients of all micro-batches of a test, in the first harness's buffers, with the
// engine's "unwritten" flags (UnitCtx::grads_fresh), starting as NaN.
struct Grads {
  std::vector<std::vector<uint8_t>> fresh;
  std::vector<std::vector<size_t>> n;
  void reset(Harness& h) {
    fresh.assign(h.units.size(), {});
    n.assign(h.units.size(), {});
    for (size_t u = 0; u < h.units.size(); ++u) {
      auto& m = h.units[u];
      float* g = m.gbuf.f32();
      std::fill(g, g + m.gbuf.bytes() / 4, std::numeric_limits<float>::quiet_NaN());
      fresh[u].assign(m.specs.size(), 1);
      for (const auto& s : m.specs) n[u].push_back(static_cast<size_t>(numel(s.shape)));
    }
  }
};

// One micro-batch: its own harness (saved activations, dx buffers) whose gradient pointers are
// the shared ones.
struct Micro {
  std::unique_ptr<Harness> h;
  std::unique_ptr<TokenBatch> tb;
};

struct Setup {
  ModelConfig cfg;
  DType dt = DType::F32;
  bool weights16 = false;  // 16-bit weight copies beside the fp32 ones (ctx.params16)
  bool grad16 = false;     // the residual gradient's 16-bit form beside it (ctx.grad16)
  bool gapped = false;     // Llama's packed products per matrix (gemm: immediate)
};

std::vector<Micro> make_micros(const Setup& s, const Ops& ops, int count) {
  std::vector<Micro> ms;
  for (int i = 0; i < count; ++i) {
    Micro m;
    m.h = std::make_unique<Harness>(s.cfg, s.gapped);
    m.h->ops = &ops;
    m.h->fused_loss = false;  // the head's gradient in backward, where the flags are
    m.h->init_random(11);
    if (s.weights16)
      m.h->keep_weights16(s.dt);
    else if (s.dt != DType::F32)
      m.h->round_params(s.dt);
    m.tb = std::make_unique<TokenBatch>(2, 8, s.cfg.vocab_size, 100 + uint64_t(i));
    if (i > 0)
      for (size_t u = 0; u < m.h->units.size(); ++u) m.h->units[u].g = ms[0].h->units[u].g;
    ms.push_back(std::move(m));
  }
  return ms;
}

// Backward of one micro-batch as the engine calls the units (Harness::backward with the
// unwritten flags and, optionally, the residual gradient's 16-bit form carried from call to
// call); before_call(pos) runs before each call.
template <class F>
void backward(Micro& m, const Setup& s, const Ops& ops, Grads& g, F before_call) {
  Harness& h = *m.h;
  const Batch& b = m.tb->batch;
  const size_t P = h.model.schedule.size();
  const size_t n = static_cast<size_t>(b.B) * b.T * h.model.d_model();
  h.dbufs.resize(P);
  std::vector<uint16_t> g16(n);
  bool dy16 = false;
  const float* dy = nullptr;
  for (size_t q = P; q-- > 0;) {
    if (q > 0 && h.dbufs[q].bytes() != n * 4) h.dbufs[q] = Buffer(n * 4, Mem::Activations);
    float* dx = q > 0 ? h.dbufs[q].f32() : nullptr;
    const Call& c = h.model.schedule[q];
    const size_t u = static_cast<size_t>(c.unit);
    UnitCtx ctx = h.ctx_for(q, b, true, true);
    ctx.ops = &ops;
    ctx.grads_fresh = g.fresh[u].data();
    ctx.grads_n = g.n[u].data();
    ctx.grad_scale = 1.f / 16;
    if (s.grad16) ctx.grad16 = g16.data(), ctx.dy16 = dy16;
    h.scratch.reset();
    before_call(q);
    h.model.units[u]->backward(ctx, c.call, q ? h.acts[q].f32() : nullptr, dy, dx);
    dy16 = ctx.dx16;
    dy = dx;
  }
}

bool same(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Tensors (parameter gradients of the shared buffers, dx of every call of every micro-batch)
// whose bits differ between two runs.
int differing(std::vector<Micro>& a, std::vector<Micro>& b) {
  int bad = 0;
  auto pa = a[0].h->all_params(), pb = b[0].h->all_params();
  for (size_t i = 0; i < pa.size(); ++i)
    if (!same(pa[i].g, pb[i].g, pa[i].n)) {
      UNSCOPED_INFO("gradient " << pa[i].spec->name << " differs");
      ++bad;
    }
  for (size_t m = 0; m < a.size(); ++m)
    for (size_t q = 1; q < a[m].h->dbufs.size(); ++q)
      if (!same(a[m].h->dbufs[q].f32(), b[m].h->dbufs[q].f32(), a[m].h->dbufs[q].bytes() / 4)) {
        UNSCOPED_INFO("micro " << m << " dx of call " << q << " differs");
        ++bad;
      }
  return bad;
}

std::vector<Setup> setups() {
  std::vector<Setup> r;
  for (const ModelConfig& c : {tiny_gpt2(), tiny_llama()}) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) r.push_back({c, dt});
    r.push_back({c, DType::BF16, true, true});
  }
  r.push_back({tiny_llama(), DType::F32, false, false, true});
  r.push_back({tiny_llama(), DType::BF16, true, false, true});
  return r;
}

std::string name(const Setup& s) {
  return s.cfg.type + " " + dtype_name(s.dt) + (s.weights16 ? " weights16" : "") +
         (s.grad16 ? " grad16" : "") + (s.gapped ? " gapped" : "");
}

// Linear products with a weight gradient per layer: GPT-2 qkv, proj, fc, fcproj; Llama the
// packed qkv, o, the packed gate|up, down (gapped: q, k, v, gate, up through gemm, immediate).
int jobs_per_layer(const Setup& s) { return s.cfg.type == "llama" && s.gapped ? 2 : 4; }

}  // namespace

TEST_CASE("deferred weight gradients: I then W equals the plain backward bit for bit",
          "[deferred_wgrad]") {
  for (const Setup& s : setups()) {
    INFO(name(s));
    const Ops& base = ops_for(Device::cpu(), s.dt);
    // Reference: the plain backward.
    auto ref = make_micros(s, base, 1);
    Grads gr;
    gr.reset(*ref[0].h);
    ref[0].h->forward(ref[0].tb->batch, true);
    backward(ref[0], s, base, gr, [](size_t) {});

    DeferredWeightGrads dw(base);
    CHECK(dw.ops().device() == base.device());
    CHECK(dw.ops().compute() == base.compute());
    CHECK(&dw.ops().stream() == &base.stream());
    const Spy spy(dw.ops());
    auto def = make_micros(s, dw.ops(), 1);
    Grads gd;
    gd.reset(*def[0].h);
    def[0].h->forward(def[0].tb->batch, true);  // (forward through the decorator: not deferring)
    CHECK(dw.pending_jobs() == 0);
    dw.begin(7);
    CHECK(dw.deferring());
    backward(def[0], s, spy, gd, [](size_t) {});
    dw.end();
    CHECK_FALSE(dw.deferring());
    const int jobs = s.cfg.n_layer * jobs_per_layer(s);
    CHECK(int(dw.pending_jobs()) == jobs);
    CHECK(spy.calls == jobs);
    // The copies: the bytes of the forms the units handed, tracked as activations.
    CHECK(dw.pending_bytes() == spy.bytes);
    CHECK(dw.pending_bytes(7) == spy.bytes);
    CHECK(dw.pending_bytes(8) == 0);
    CHECK(spy.bytes > 0);
    const int64_t held = int64_t(MemTracker::global().current(Mem::Activations));
    // W has not run: the deferred weight gradients still hold the NaN they started with.
    auto before = def[0].h->all_params();
    int untouched = 0;
    for (const auto& p : before) untouched += std::isnan(p.g[0]) ? 1 : 0;
    CHECK(untouched > 0);
    // dx of every call is final already.
    for (size_t q = 1; q < def[0].h->dbufs.size(); ++q)
      CHECK(same(def[0].h->dbufs[q].f32(), ref[0].h->dbufs[q].f32(),
                 def[0].h->dbufs[q].bytes() / 4));
    CHECK(differing(ref, def) == untouched);
    dw.run(8);  // another key: nothing
    CHECK(int(dw.pending_jobs()) == jobs);
    dw.run(7);
    CHECK(dw.pending_jobs() == 0);
    CHECK(dw.pending_bytes() == 0);
    // run() freed the copies, and only them.
    CHECK(held - int64_t(MemTracker::global().current(Mem::Activations)) == spy.bytes);
    CHECK(differing(ref, def) == 0);
  }
}

TEST_CASE("deferred weight gradients: I(0) I(1) W(0) W(1) equals B(0) B(1)",
          "[deferred_wgrad]") {
  for (const Setup& s : setups()) {
    INFO(name(s));
    const Ops& base = ops_for(Device::cpu(), s.dt);
    auto ref = make_micros(s, base, 2);
    Grads gr;
    gr.reset(*ref[0].h);
    for (int m = 0; m < 2; ++m) {
      ref[size_t(m)].h->forward(ref[size_t(m)].tb->batch, true);
      backward(ref[size_t(m)], s, base, gr, [](size_t) {});
    }

    DeferredWeightGrads dw(base);
    auto def = make_micros(s, dw.ops(), 2);
    Grads gd;
    gd.reset(*def[0].h);
    for (int m = 0; m < 2; ++m) {
      def[size_t(m)].h->forward(def[size_t(m)].tb->batch, true);
      dw.begin(uint64_t(m) * 64);
      backward(def[size_t(m)], s, dw.ops(), gd, [](size_t) {});
      dw.end();
    }
    const int jobs = s.cfg.n_layer * jobs_per_layer(s);
    CHECK(int(dw.pending_jobs()) == 2 * jobs);
    CHECK(dw.pending_bytes(0) + dw.pending_bytes(64) == dw.pending_bytes());
    CHECK(dw.pending_bytes(0) > 0);
    dw.run(0);
    CHECK(int(dw.pending_jobs()) == jobs);
    dw.run(64);
    CHECK(dw.pending_bytes() == 0);
    CHECK(differing(ref, def) == 0);
  }
}

// What the header asks of the caller: one unit's W jobs in micro-batch order. Run the other
// way round, micro 1's add-jobs meet the unwritten (NaN) buffers and micro 0's then overwrite
// them: the comparison sees it.
TEST_CASE("deferred weight gradients: W out of micro-batch order is wrong", "[deferred_wgrad]") {
  const Setup s{tiny_gpt2(), DType::F32};
  const Ops& base = ops_for(Device::cpu(), s.dt);
  auto ref = make_micros(s, base, 2);
  Grads gr;
  gr.reset(*ref[0].h);
  for (auto& m : ref) {
    m.h->forward(m.tb->batch, true);
    backward(m, s, base, gr, [](size_t) {});
  }
  DeferredWeightGrads dw(base);
  auto def = make_micros(s, dw.ops(), 2);
  Grads gd;
  gd.reset(*def[0].h);
  for (int m = 0; m < 2; ++m) {
    def[size_t(m)].h->forward(def[size_t(m)].tb->batch, true);
    dw.begin(uint64_t(m));
    backward(def[size_t(m)], s, dw.ops(), gd, [](size_t) {});
    dw.end();
  }
  dw.run(1);
  dw.run(0);
  CHECK(differing(ref, def) == s.cfg.n_layer * 8);  // 4 weights and 4 biases a layer
}

// One block's jobs (recorded under a key of their own) never run: exactly that block's linear
// weight and bias gradients differ; dx and every other gradient stay equal.
TEST_CASE("deferred weight gradients: a job left out is caught", "[deferred_wgrad]") {
  for (const Setup& s : {Setup{tiny_gpt2(), DType::F32}, Setup{tiny_llama(), DType::BF16}}) {
    INFO(name(s));
    const Ops& base = ops_for(Device::cpu(), s.dt);
    auto ref = make_micros(s, base, 1);
    Grads gr;
    gr.reset(*ref[0].h);
    ref[0].h->forward(ref[0].tb->batch, true);
    backward(ref[0], s, base, gr, [](size_t) {});

    DeferredWeightGrads dw(base);
    auto def = make_micros(s, dw.ops(), 1);
    Grads gd;
    gd.reset(*def[0].h);
    def[0].h->forward(def[0].tb->batch, true);
    // Each call's jobs under its position; position 1 is the first block.
    backward(def[0], s, dw.ops(), gd, [&](size_t q) {
      if (dw.deferring()) dw.end();
      dw.begin(q);
    });
    dw.end();
    CHECK(dw.pending_bytes(0) == 0);  // the embedding: no linear
    CHECK(dw.pending_bytes(1) > 0);
    const size_t P = def[0].h->model.schedule.size();
    for (size_t q = 0; q < P; ++q)
      if (q != 1) dw.run(q);
    CHECK(int(dw.pending_jobs()) == jobs_per_layer(s));
    // GPT-2: 4 weights + 4 biases; Llama: o, down, and q, k, v, gate, up (the packed ones).
    CHECK(differing(ref, def) == (s.cfg.type == "gpt2" ? 8 : 7));
    dw.run(1);
    CHECK(differing(ref, def) == 0);
  }
}

// ---- On a device: the simulated accelerator (tests/common/sim_device.h), whose memory faults
// when host code touches it outside its ops and copies. linear_backward called directly with
// every form (fp32, 16-bit, both; an odd 16-bit extent, copied with copy_bytes), its dout and
// inp overwritten and its weight poisoned between I and W (as a unit's scratch is reused and a
// FULL_SHARD unit's parameters freed): the bits of the plain call.

namespace {

struct DevBuf {
  Buffer b;
  DevBuf(const std::vector<float>& h, Device d) : b(h.size() * 4, Mem::Workspace, d) {
    copy_bytes(b.data(), d, h.data(), Device::cpu(), h.size() * 4);
  }
  DevBuf(const std::vector<uint16_t>& h, Device d) : b(h.size() * 2, Mem::Workspace, d) {
    copy_bytes(b.data(), d, h.data(), Device::cpu(), h.size() * 2);
  }
  std::vector<float> f32() const {
    std::vector<float> h(b.bytes() / 4);
    copy_bytes(h.data(), Device::cpu(), b.data(), b.device(), b.bytes());
    return h;
  }
  template <class T>
  void set(const std::vector<T>& h) {
    copy_bytes(b.data(), b.device(), h.data(), Device::cpu(), h.size() * sizeof(T));
  }
};

std::vector<float> randoms(size_t n, uint64_t seed) {
  Rng r(seed, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.below(2001)) / 1000.f - 1.f;
  return v;
}

std::vector<uint16_t> narrowed(DType dt, const std::vector<float>& x) {
  std::vector<uint16_t> r(x.size());
  ops_for(Device::cpu()).narrow(dt, x.data(), r.data(), x.size());
  return r;
}

}  // namespace

TEST_CASE("deferred weight gradients on a device: the plain call's bits", "[deferred_wgrad]") {
  const Device dev = Device::sim(0);
  const DType dt = DType::BF16;
  const Ops& base = ops_for(dev, dt);
  // (N, C, OC): N * OC and N * C even and odd.
  for (auto [N, C, OC] : {std::tuple{6, 8, 10}, std::tuple{5, 7, 3}})
    for (int form = 0; form < 3; ++form) {  // dout and inp: fp32, 16-bit, both
      INFO("N " << N << " C " << C << " OC " << OC << " form " << form);
      const auto dout = randoms(size_t(N) * OC, 1), inp = randoms(size_t(N) * C, 2),
                 w = randoms(size_t(OC) * C, 3), gd = randoms(size_t(N) * OC, 4),
                 gx = randoms(size_t(N) * C, 5);
      const std::vector<float> nan(size_t(OC) * C, std::numeric_limits<float>::quiet_NaN());
      const auto d16 = narrowed(dt, dout), x16 = narrowed(dt, inp);
      // Both forms must be the same values: the fp32 form the widening of the 16-bit one.
      std::vector<float> dout_r(d16.size()), inp_r(x16.size());
      ops_for(Device::cpu()).widen(dt, d16.data(), dout_r.data(), d16.size());
      ops_for(Device::cpu()).widen(dt, x16.data(), inp_r.data(), x16.size());
      // Two calls per run, as two micro-batches: the first writes dw and db, the second adds.
      auto run = [&](bool defer) {
        DevBuf D(form == 1 ? dout : dout_r, dev), X(form == 1 ? inp : inp_r, dev), D16(d16, dev),
            X16(x16, dev), W(w, dev), dW(nan, dev),
            dB(std::vector<float>(size_t(OC), std::numeric_limits<float>::quiet_NaN()), dev),
            dI(std::vector<float>(size_t(N) * C, 0.5f), dev);
        const Operand od = form == 0 ? Operand(D.b.f32())
                           : form == 1 ? Operand(D16.b.as<uint16_t>())
                                       : Operand(D.b.f32(), D16.b.as<uint16_t>());
        const Operand ox = form == 0 ? Operand(X.b.f32())
                           : form == 1 ? Operand(X16.b.as<uint16_t>())
                                       : Operand(X.b.f32(), X16.b.as<uint16_t>());
        DeferredWeightGrads zb(base);
        const Ops& ops = defer ? zb.ops() : base;
        if (defer) zb.begin(0);
        ops.linear_backward(dI.b.f32(), GradOut(dW.b.f32(), true), GradOut(dB.b.f32(), true), od,
                            ox, W.b.f32(), N, C, OC);
        ops.linear_backward(GradIn::set(dI.b.f32()), dW.b.f32(), dB.b.f32(), od, ox, W.b.f32(),
                            N, C, OC);
        if (defer) {
          zb.end();
          CHECK(zb.pending_jobs() == 2);
          const int per = form == 0 ? 4 : form == 1 ? 2 : 6;
          CHECK(zb.pending_bytes() == 2 * int64_t{per} * (N * OC + N * C));
          // The unit's buffers change before W; the weight is gone.
          D.set(gd), X.set(gx), D16.set(narrowed(dt, gd)), X16.set(narrowed(dt, gx)), W.set(nan);
          zb.run(0);
          CHECK(zb.pending_bytes() == 0);
        }
        return std::vector<std::vector<float>>{dI.f32(), dW.f32(), dB.f32()};
      };
      const auto a = run(false), b = run(true);
      for (size_t i = 0; i < a.size(); ++i) {
        INFO("output " << i << " (dinp, dw, db)");
        CHECK(std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) == 0);
        CHECK(std::none_of(a[i].begin(), a[i].end(), [](float v) { return std::isnan(v); }));
      }
    }
}
