// A tiny stand-in for the engine, for model tests: owns every unit's parameters and gradients
// (one 64-byte-aligned buffer per unit, tensors at 16-float-aligned offsets as the flat layout
// places them, or with gaps so that no two tensors are adjacent), runs the schedule forward
// and then backward in reverse, exactly as the unit contract describes.
#pragma once
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/rng.h"
#include "kernels/ops.h"
#include "models/model.h"

namespace swtest {

struct Harness {
  struct UnitMem {
    std::vector<sw::ParamSpec> specs;
    sw::Buffer pbuf, gbuf;
    std::vector<float*> p, g;
    sw::Buffer p16buf;               // keep_weights16: the 16-bit copy of pbuf
    std::vector<const uint16_t*> p16;
  };

  sw::Model model;
  const sw::Ops* ops;
  std::vector<UnitMem> units;
  std::vector<sw::Saved> saved;    // one per schedule position (call site)
  std::vector<sw::Buffer> acts;    // input of each schedule position (residual stream)
  std::vector<sw::Buffer> dbufs;   // dx of each schedule position
  sw::Scratch scratch;
  bool fused_loss = true;          // false: the loss forward sees no grads (as a recompute would)
  bool in_place = false;           // give dx == dy to units that allow it (as the engine does)

  // gapped: leave 16 floats between tensors, so no two are contiguous (packed-GEMM fallback).
  explicit Harness(const sw::ModelConfig& cfg, bool gapped = false)
      : model(sw::build_model(cfg)), ops(&sw::ops_for(sw::Device::cpu())) {
    for (auto& u : model.units) {
      UnitMem m;
      m.specs = u->params();
      std::vector<int64_t> off;
      int64_t total = 0;
      for (const auto& s : m.specs) {
        off.push_back(total);
        total += (sw::numel(s.shape) + 15) / 16 * 16 + (gapped ? 16 : 0);
      }
      total = std::max<int64_t>(total, 16);
      m.pbuf = sw::Buffer(static_cast<size_t>(total) * 4, sw::Mem::Params);
      m.gbuf = sw::Buffer(static_cast<size_t>(total) * 4, sw::Mem::Grads);
      m.pbuf.zero();
      m.gbuf.zero();
      for (size_t i = 0; i < m.specs.size(); ++i) {
        m.p.push_back(m.pbuf.f32() + off[i]);
        m.g.push_back(m.gbuf.f32() + off[i]);
      }
      units.push_back(std::move(m));
    }
    saved.resize(model.schedule.size());
  }

  // Every parameter random (norm weights around 1, biases small but non-zero) so that every
  // path carries signal. `scale` multiplies the std of the matrices.
  void init_random(uint64_t seed, float scale = 1.f) {
    for (auto& m : units)
      for (size_t i = 0; i < m.specs.size(); ++i) {
        const sw::ParamSpec& s = m.specs[i];
        const uint64_t stream = sw::rng_stream(s.name.c_str());
        const int64_t n = sw::numel(s.shape);
        for (int64_t k = 0; k < n; ++k) {
          const float z = sw::rng_normal(seed, stream, static_cast<uint64_t>(k));
          float v = 0;
          switch (s.init) {
            case sw::Init::Normal: v = scale * 0.1f * z; break;
            case sw::Init::Ones: v = 1.f + 0.1f * z; break;
            case sw::Init::Zeros: v = 0.05f * z; break;
          }
          m.p[i][k] = v;
        }
      }
  }

  struct Ref {
    const sw::ParamSpec* spec;
    float* p;
    float* g;
    size_t n;
  };
  std::vector<Ref> all_params() {
    std::vector<Ref> r;
    for (auto& m : units)
      for (size_t i = 0; i < m.specs.size(); ++i)
        r.push_back({&m.specs[i], m.p[i], m.g[i], static_cast<size_t>(sw::numel(m.specs[i].shape))});
    return r;
  }
  Ref find(const std::string& name) {
    for (const Ref& r : all_params())
      if (r.spec->name == name) return r;
    throw std::runtime_error("no parameter " + name);
  }

  // Rounds every parameter to dt (as a mixed-precision unit's compute copy holds them).
  void round_params(sw::DType dt) {
    for (auto& m : units) sw::ops_for(sw::Device::cpu()).round_to(dt, m.pbuf.f32(), m.pbuf.bytes() / 4);
  }
  // round_params, and a 16-bit copy of every parameter handed to the units as ctx.params16
  // (what the engine does on a device).
  void keep_weights16(sw::DType dt) {
    for (auto& m : units) {
      const size_t n = m.pbuf.bytes() / 4;
      m.p16buf = sw::Buffer(n * 2, sw::Mem::Params);
      auto* h = static_cast<uint16_t*>(m.p16buf.data());
      sw::ops_for(sw::Device::cpu()).round_copy_lp(dt, m.pbuf.f32(), h, m.pbuf.f32(), n);
      m.p16.clear();
      for (float* q : m.p) m.p16.push_back(h + (q - m.pbuf.f32()));
    }
  }

  void zero_grads() {
    for (auto& m : units) m.gbuf.zero();
  }

  static int64_t count(const sw::Batch& b) {
    int64_t n = 0;
    for (int i = 0; i < b.B * b.T; ++i) n += b.targets[i] >= 0;
    return n;
  }

  sw::UnitCtx ctx_for(size_t pos, const sw::Batch& b, bool training, bool with_grads) {
    const sw::Call& c = model.schedule[pos];
    UnitMem& m = units[static_cast<size_t>(c.unit)];
    sw::UnitCtx ctx;
    ctx.ops = ops;
    ctx.batch = &b;
    ctx.params = &m.p;
    ctx.params16 = m.p16.empty() ? nullptr : &m.p16;
    ctx.grads = with_grads ? &m.g : nullptr;
    ctx.saved = &saved[pos];
    ctx.scratch = &scratch;
    ctx.training = training;
    return ctx;
  }

  // Forward over the schedule; returns the mean loss (or writes last-position logits).
  double forward(const sw::Batch& b, bool training, float* logits = nullptr) {
    const size_t P = model.schedule.size();
    const size_t n = static_cast<size_t>(b.B) * b.T * model.d_model();
    acts.resize(P);
    for (size_t p = 1; p < P; ++p)
      if (acts[p].bytes() != n * 4) acts[p] = sw::Buffer(n * 4, sw::Mem::Activations);
    const double grad_scale = 1.0 / static_cast<double>(std::max<int64_t>(1, count(b)));
    double loss_sum = 0;
    int64_t loss_count = 0;
    for (size_t p = 0; p < P; ++p) {
      const bool last = p + 1 == P;
      sw::UnitCtx ctx = ctx_for(p, b, training, training && (!last || fused_loss));
      ctx.grad_scale = static_cast<float>(grad_scale);
      ctx.logits = logits;
      scratch.reset();
      const sw::Call& c = model.schedule[p];
      model.units[static_cast<size_t>(c.unit)]->forward(ctx, c.call, p ? acts[p].f32() : nullptr,
                                                         last ? nullptr : acts[p + 1].f32());
      loss_sum += ctx.loss_sum;
      loss_count += ctx.loss_count;
    }
    return loss_count ? loss_sum / static_cast<double>(loss_count) : 0.0;
  }

  void backward(const sw::Batch& b) {
    const size_t P = model.schedule.size();
    const size_t n = static_cast<size_t>(b.B) * b.T * model.d_model();
    dbufs.resize(P);
    const double grad_scale = 1.0 / static_cast<double>(std::max<int64_t>(1, count(b)));
    const float* dy = nullptr;
    for (size_t q = P; q-- > 0;) {
      if (q > 0 && dbufs[q].bytes() != n * 4) dbufs[q] = sw::Buffer(n * 4, sw::Mem::Activations);
      float* dx = q > 0 ? dbufs[q].f32() : nullptr;
      const sw::Call& call = model.schedule[q];
      if (in_place && q > 0 && dy && model.units[static_cast<size_t>(call.unit)]->backward_in_place())
        dx = const_cast<float*>(dy);  // one of dbufs (dy is the previous dx)
      sw::UnitCtx ctx = ctx_for(q, b, true, true);
      ctx.grad_scale = static_cast<float>(grad_scale);
      scratch.reset();
      const sw::Call& c = model.schedule[q];
      model.units[static_cast<size_t>(c.unit)]->backward(ctx, c.call, q ? acts[q].f32() : nullptr,
                                                          dy, dx);
      dy = dx;
    }
  }

  // Gradients of the mean loss, from zero. Returns the mean loss.
  double forward_backward(const sw::Batch& b) {
    zero_grads();
    const double loss = forward(b, true);
    backward(b);
    return loss;
  }

  double eval_loss(const sw::Batch& b) { return forward(b, false); }
};

// Deterministic tokens/targets; every `ignore_every`-th target is -1 (ignored).
struct TokenBatch {
  std::vector<int32_t> tokens, targets;
  sw::Batch batch;
  TokenBatch(int B, int T, int V, uint64_t seed, int ignore_every = 7) {
    sw::Rng rng(seed, 77);
    for (int i = 0; i < B * T; ++i) tokens.push_back(static_cast<int32_t>(rng.below(V)));
    for (int i = 0; i < B * T; ++i)
      targets.push_back(ignore_every > 0 && i % ignore_every == ignore_every - 1
                            ? -1
                            : static_cast<int32_t>(rng.below(V)));
    batch.tokens = tokens.data();
    batch.targets = targets.data();
    batch.B = B;
    batch.T = T;
  }
};

}  // namespace swtest
