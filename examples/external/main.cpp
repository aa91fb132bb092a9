// Trains a model of its own (two Unit subclasses) and a built-in Llama through Shardwise's
// installed C++ API only: <shardwise/shardwise.h>, linked as Shardwise::shardwise.
//
//   external_train [--steps N] [--dir D]
// Under `mpirun -np R` the models are sharded over the R ranks (FULL_SHARD). Exits non-zero
// unless each model's loss falls, a checkpoint saved and loaded gives the same evaluation
// loss, and the planner predicts a step. D: where the checkpoint goes (default: a folder in
// /tmp, removed at the end).
#include <shardwise/shardwise.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace {

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

sw::Model custom_model() {
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

// A learnable sequence: each token is the previous one plus a step that each sequence draws.
struct Data {
  std::vector<int32_t> tok, tgt;
  sw::Batch batch(int B, int T, unsigned seed, int vocab) {
    std::mt19937 rng(seed);
    tok.resize(size_t(B) * T);
    tgt.resize(size_t(B) * T);
    for (int b = 0; b < B; ++b) {
      int t0 = int(rng() % unsigned(vocab)), step = 1 + int(rng() % 2u);
      for (int t = 0; t < T; ++t) {
        tok[size_t(b) * T + t] = (t0 + t * step) % vocab;
        tgt[size_t(b) * T + t] = (t0 + (t + 1) * step) % vocab;
      }
    }
    return {tok.data(), tgt.data(), B, T};
  }
};

// Trains `model` for `steps` steps; returns whether its loss fell below 70% of the first.
bool train(const char* what, sw::Model& model, int steps, float lr, const std::string& ckpt) {
  sw::api::ShardedOptions opt;
  opt.lr = lr;
  sw::api::ShardedModel sm(model, opt);
  const int B = 4, T = 16, V = model.config.vocab_size;
  Data d;
  double first = 0, last = 0;
  for (int s = 1; s <= steps; ++s) {
    // Each rank its own share of the step's batch (seeded by step and rank).
    const sw::api::StepResult r = sm.train_step(d.batch(B, T, unsigned(s * 1000 + sm.rank()), V));
    if (s == 1) first = r.loss;
    last = r.loss;
    if (sm.rank() == 0 && (s == 1 || s % 20 == 0 || s == steps))
      std::printf("%s: step %3d loss %.4f grad_norm %.3f\n", what, r.step, r.loss, r.grad_norm);
  }
  bool ok = last < 0.7 * first;
  if (!ckpt.empty()) {  // save, train on, load back: the evaluation loss is the saved one's
    Data held;  // the evaluation batch's memory, apart from the training batches'
    const sw::Batch eval = held.batch(B, T, 7u, V);
    const double before = sm.eval_loss(eval);
    sm.save(ckpt);
    sw::api::verify_checkpoint(ckpt);
    sm.train_step(d.batch(B, T, 99u, V));
    const double moved = sm.eval_loss(eval);
    sm.load(ckpt);
    const double after = sm.eval_loss(eval);
    if (sm.rank() == 0)
      std::printf("%s: checkpoint at step %d: eval loss %.6f (one more step: %.6f), after load %.6f\n",
                  what, sm.step(), before, moved, after);
    ok = ok && after == before && sm.step() == steps;
  }
  if (sm.rank() == 0)
    std::printf("%s: %lld parameters, loss %.4f -> %.4f: %s\n", what,
                static_cast<long long>(sm.num_params()), first, last, ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 60;
  std::string dir;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else {
      std::fprintf(stderr, "external_train: unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  const bool own_dir = dir.empty();
  if (own_dir) dir = (std::filesystem::temp_directory_path() / "shardwise_external_XXXXXX").string();
  if (own_dir && !mkdtemp(dir.data())) {
    std::perror("external_train: mkdtemp");
    return 1;
  }
  std::printf("Shardwise %s (%d.%d.%d)\n", SHARDWISE_VERSION_STRING, SHARDWISE_VERSION_MAJOR,
              SHARDWISE_VERSION_MINOR, SHARDWISE_VERSION_PATCH);
  int bad = 0;
  try {
    sw::api::PlanRequest req;
    req.world = 4;
    req.micro_batch = 4;
    const sw::api::PlanFigures f = sw::api::predict_step(custom_model(), req);
    std::printf("plan: custom model on 4 ranks: peak %lld bytes per rank (activations %lld)\n",
                static_cast<long long>(f.device_peak), static_cast<long long>(f.activations));
    bad += f.device_peak <= 0;

    sw::Model mine = custom_model();
    bad += !train("custom", mine, steps, 1e-2f, "");

    sw::ModelConfig cfg;  // a tiny Llama
    cfg.type = "llama";
    cfg.vocab_size = kVocab;
    cfg.n_layer = 2;
    cfg.n_head = 4;
    cfg.n_kv_head = 2;
    cfg.d_model = 64;
    cfg.seq_len = 16;
    sw::Model llama = sw::build_model(cfg);
    bad += !train("llama", llama, steps, 3e-3f, dir + "/llama");
  } catch (const sw::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    bad = 1;
  }
  if (own_dir) std::filesystem::remove_all(dir);
  return bad ? 1 : 0;
}
