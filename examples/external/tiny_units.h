// The custom model of examples/external: a tied embedding / loss head and residual MLP blocks,
// written against the public headers only (tests/api uses it too).
#pragma once
#include <shardwise/shardwise.h>

#include <memory>
#include <string>
#include <vector>

namespace tiny {

constexpr int kVocab = 32, kDim = 32, kHidden = 64;
constexpr sw::SavedSlot<float> kH{0, sw::Keep::Always, "h"}, kRstd{1, sw::Keep::Always, "rstd"},
    kDh{2, sw::Keep::Always, "dh"}, kA{2, sw::Keep::Always, "a"}, kG{3, sw::Keep::Always, "g"};

// Call 0: token embedding. Call 1: RMSNorm and the tied output head with the loss.
class Embedding final : public sw::Unit {
 public:
  std::string name() const override { return "embedding"; }
  std::vector<sw::ParamSpec> params() const override {
    return {{.name = "tok.weight", .shape = {kVocab, kDim}, .init = sw::Init::Normal, .std = 0.05f},
            {.name = "norm.weight", .shape = {kDim}, .init = sw::Init::Ones, .weight_decay = false}};
  }
  int num_calls() const override { return 2; }
  void forward(sw::UnitCtx& c, int call, const float* x, float* y) override {
    const sw::Batch& b = *c.batch;
    const int N = b.B * b.T;
    if (call == 0) {
      c.ops->embedding_forward(y, b.tokens, c.param(0), nullptr, b.B, b.T, kDim, kVocab);
      return;
    }
    float* h = c.saved->put(kH, size_t(N) * kDim);
    c.ops->rmsnorm_forward(h, c.saved->put(kRstd, N), x, c.param(1), N, kDim, 1e-5f);
    if (c.logits) sw::fail("external", "embedding: no sampling in this example");
    float* dh = c.training ? c.saved->put(kDh, size_t(N) * kDim) : nullptr;
    if (dh) c.ops->fill(dh, 0.f, size_t(N) * kDim);
    sw::add_loss(c, c.scratch->f32(N), dh, dh ? c.grad(0) : nullptr, h, c.param(0), kDim, kVocab);
  }
  void backward(sw::UnitCtx& c, int call, const float* x, const float* dy, float* dx) override {
    const sw::Batch& b = *c.batch;
    const int N = b.B * b.T;
    if (call == 0) {
      c.ops->embedding_backward(c.grad(0), nullptr, dy, b.tokens, b.B, b.T, kDim);
      return;
    }
    c.ops->fill(dx, 0.f, size_t(N) * kDim);
    c.ops->rmsnorm_backward(dx, c.grad(1), c.saved->get(kDh), x, c.param(1), c.saved->get(kRstd),
                            N, kDim);
  }
  sw::ActivationDecl declare_activations(int call, sw::BatchShape s) const override {
    sw::ActivationDecl d;
    if (call == 0) return d;
    const size_t N = size_t(s.B) * size_t(s.T), h_rstd = (N * kDim + N) * sizeof(float);
    d.saved = h_rstd + N * kDim * sizeof(float);
    d.scratch_fwd = d.scratch_eval = sw::Scratch::bytes_for(N);
    d.saved_eval = d.saved_logits = h_rstd;
    return d;
  }
};

// y = x + W2 gelu(W1 RMSNorm(x)): a residual MLP block.
class MlpBlock final : public sw::Unit {
 public:
  explicit MlpBlock(int i) : pre_("mlp." + std::to_string(i) + ".") {}
  std::string name() const override { return pre_.substr(0, pre_.size() - 1); }
  std::vector<sw::ParamSpec> params() const override {
    return {{.name = pre_ + "norm.weight", .shape = {kDim}, .init = sw::Init::Ones,
             .weight_decay = false},
            {.name = pre_ + "w1", .shape = {kHidden, kDim}},
            {.name = pre_ + "w2", .shape = {kDim, kHidden}, .init = sw::Init::Normal, .std = 0.01f}};
  }
  void forward(sw::UnitCtx& c, int, const float* x, float* y) override {
    const int N = c.batch->B * c.batch->T;
    float* h = c.saved->put(kH, size_t(N) * kDim);
    float* a = c.saved->put(kA, size_t(N) * kHidden);
    float* g = c.saved->put(kG, size_t(N) * kHidden);
    c.ops->rmsnorm_forward(h, c.saved->put(kRstd, N), x, c.param(0), N, kDim, 1e-5f);
    c.ops->linear_forward(a, h, c.param(1), nullptr, nullptr, N, kDim, kHidden);
    c.ops->gelu_forward(g, a, size_t(N) * kHidden);
    c.ops->linear_forward(y, g, c.param(2), nullptr, x, N, kHidden, kDim);  // + x
  }
  void backward(sw::UnitCtx& c, int, const float* x, const float* dy, float* dx) override {
    const int N = c.batch->B * c.batch->T;
    float* dg = c.scratch->f32(size_t(N) * kHidden);
    float* da = c.scratch->f32(size_t(N) * kHidden);
    float* dh = c.scratch->f32(size_t(N) * kDim);
    c.ops->fill(dg, 0.f, size_t(N) * kHidden);
    c.ops->fill(da, 0.f, size_t(N) * kHidden);
    c.ops->fill(dh, 0.f, size_t(N) * kDim);
    c.ops->linear_backward(dg, c.grad(2), nullptr, dy, c.saved->get(kG), c.param(2), N, kHidden, kDim);
    c.ops->gelu_backward(da, c.saved->get(kA), dg, size_t(N) * kHidden);
    c.ops->linear_backward(dh, c.grad(1), nullptr, da, c.saved->get(kH), c.param(1), N, kDim, kHidden);
    c.ops->copy(dx, dy, size_t(N) * kDim);  // the residual path
    c.ops->rmsnorm_backward(dx, c.grad(0), dh, x, c.param(0), c.saved->get(kRstd), N, kDim);
  }
  sw::ActivationDecl declare_activations(int, sw::BatchShape s) const override {
    const size_t N = size_t(s.B) * size_t(s.T);
    sw::ActivationDecl d;
    d.saved = d.saved_eval = d.saved_logits = (N * kDim + N + 2 * N * kHidden) * sizeof(float);
    d.scratch_bwd = 2 * sw::Scratch::bytes_for(N * kHidden) + sw::Scratch::bytes_for(N * kDim);
    return d;
  }

 private:
  std::string pre_;
};

inline sw::Model custom_model() {
  sw::Model m;
  m.config.type = "custom";
  m.config.vocab_size = kVocab;
  m.config.d_model = kDim;
  m.config.n_layer = 2;
  m.config.seq_len = 16;
  m.units.push_back(std::make_unique<Embedding>());
  m.schedule.push_back({0, 0});
  for (int i = 0; i < 2; ++i) {
    m.units.push_back(std::make_unique<MlpBlock>(i));
    m.schedule.push_back({i + 1, 0});
  }
  m.schedule.push_back({0, 1});
  return m;
}

}  // namespace tiny
