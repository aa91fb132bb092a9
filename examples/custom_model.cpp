// A custom model written against Shardwise's public C++ API, trained end to end.
//
// The model is a small causal "shift-MLP" language model: no attention, each block mixes a
// token with its predecessor through a learned causal convolution of width 2, then an MLP:
//
//   h = RMSNorm(x);  m[t] = h[t] @ Wa^T + h[t-1] @ Wb^T;  x += Wout @ gelu(m)
//
// Everything a user writes is here: Unit subclasses that declare parameters (ParamSpec) and
// their activation memory (declare_activations) and implement forward/backward with the
// kernels of kernels/ops.h, a Model that lists the units
// and their schedule, and a run of sw::Trainer (shardwise/trainer.h) on that model: the same
// training loop `shardwise train` runs (ShardedModel owns parameters, gradients and optimizer
// state, and shards them across ranks under mpirun), reporting each step to a callback.
//
//   custom_model [--steps N] [--run-dir DIR] [--gradcheck] [--check-activations]
//   custom_model --plan [--world-size N] [--undeclared] [--measure-unknown]
//   mpirun -np T custom_model --tensor T [--steps N]
// Training writes the synthetic language below as a token file into DIR (default: a directory
// under the system's temporary directory), trains on it, and exits non-zero unless the loss
// fell below half its start. --gradcheck compares every parameter gradient with central finite differences and exits
// non-zero on a mismatch; --check-activations runs every unit call and compares the memory it
// allocates with its declare_activations() (the test suite runs both). --plan predicts, with
// the memory planner and without running the model, each rank's peak memory and process RSS
// for a training step on N ranks (FULL_SHARD, B=8, T=32). --undeclared makes the blocks behave
// as a unit written without declare_activations: the planner then refuses, naming the unit,
// unless --measure-unknown asks it to run each such call once and use what it allocated.
// --tensor T splits the model over T ranks (tensor parallelism with sequence parallelism, the
// way the built-in GPT-2 and Llama split: see TensorShiftMlpBlock and TensorEmbedHead below),
// trains it, trains the whole model alone on every rank too, and exits non-zero unless the
// losses agree within 1e-5.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/ops.h"
#include "models/activation_check.h"
#include "models/model.h"
#include "planner/search.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "shardwise/trainer.h"

using namespace sw;

namespace {

constexpr int kVocab = 64, kDim = 64, kHidden = 128, kLayers = 2;
// What the calls keep from forward for backward: typed slots of their Saved (models/unit.h),
// so forward and backward name the same buffer. Each call has a Saved of its own.
constexpr SavedSlot<float> kH{0, Keep::Always, "h"}, kRstd{1, Keep::Always, "rstd"},
    kDh{2, Keep::Always, "dh"}, kM{2, Keep::Always, "m"}, kG{3, Keep::Always, "g"};
bool g_undeclared = false;  // --undeclared: the blocks do not declare (see the header)

// Token embedding in; call 1 is the loss head (tied weights: the same unit runs twice).
class EmbedHead final : public Unit {
 public:
  std::string name() const override { return "embed_head"; }
  std::vector<ParamSpec> params() const override {
    return {{.name = "tok.weight", .shape = {kVocab, kDim}, .init = Init::Normal, .std = 0.05f},
            {.name = "norm.weight", .shape = {kDim}, .init = Init::Ones, .weight_decay = false}};
  }
  int num_calls() const override { return 2; }
  void forward(UnitCtx& c, int call, const float* x, float* y) override {
    const Batch& b = *c.batch;
    const int N = b.B * b.T;
    if (call == 0) {  // embedding
      c.ops->embedding_forward(y, b.tokens, c.param(0), nullptr, b.B, b.T, kDim, kVocab);
      return;
    }
    float* h = c.saved->put(kH, size_t(N) * kDim);
    float* rstd = c.saved->put(kRstd, N);
    c.ops->rmsnorm_forward(h, rstd, x, c.param(1), N, kDim, 1e-5f);
    if (c.logits) {  // inference: logits of the last position
      for (int i = 0; i < b.B; ++i)
        c.ops->linear_forward(c.logits + size_t(i) * kVocab, h + (size_t(i) * b.T + b.T - 1) * kDim,
                              c.param(0), nullptr, nullptr, 1, kDim, kVocab);
      return;
    }
    float* dh = c.training ? c.saved->put(kDh, size_t(N) * kDim) : nullptr;
    if (dh) c.ops->fill(dh, 0.f, size_t(N) * kDim);
    // The sum of token losses and the targets counted, reported into c (on a GPU the sum
    // stays on the device until the engine reads the step's losses).
    add_loss(c, c.scratch->f32(N), dh, dh ? c.grad(0) : nullptr, h, c.param(0), kDim, kVocab);
  }
  // Declaring activation memory: what forward/backward will ask of c.saved and c.scratch, in
  // bytes, before they run (the memory planner sizes a step from this; a unit that does not
  // declare still runs, and the planner reports it). Saved requests count n * 4 bytes, Scratch
  // requests Scratch::bytes_for(n). Call 0 allocates nothing; call 1 keeps h and rstd (in
  // inference too, where the engine clears them after the call) and, training, dh.
  ActivationDecl declare_activations(int call, BatchShape s) const override {
    ActivationDecl d;
    if (call == 0) return d;
    const size_t N = size_t(s.B) * size_t(s.T), h_rstd = (N * kDim + N) * sizeof(float);
    d.saved = h_rstd + N * kDim * sizeof(float);  // h, rstd, dh
    d.scratch_fwd = Scratch::bytes_for(N);        // per-row losses
    d.saved_eval = h_rstd;
    d.scratch_eval = Scratch::bytes_for(N);
    d.saved_logits = h_rstd;                      // logits go to c.logits, no scratch
    return d;
  }
  void backward(UnitCtx& c, int call, const float* x, const float* dy, float* dx) override {
    const Batch& b = *c.batch;
    const int N = b.B * b.T;
    if (call == 0) {
      c.ops->embedding_backward(c.grad(0), nullptr, dy, b.tokens, b.B, b.T, kDim);
      return;
    }
    c.ops->fill(dx, 0.f, size_t(N) * kDim);
    c.ops->rmsnorm_backward(dx, c.grad(1), c.saved->get(kDh), x, c.param(1),
                            c.saved->get(kRstd), N, kDim);
  }
};

// The custom block: RMSNorm, causal width-2 convolution (Wa on t, Wb on t-1), GELU, out-proj.
class ShiftMlpBlock final : public Unit {
 public:
  explicit ShiftMlpBlock(int i) : pre_("blocks." + std::to_string(i) + ".") {}
  std::string name() const override { return pre_.substr(0, pre_.size() - 1); }
  std::vector<ParamSpec> params() const override {
    return {{.name = pre_ + "norm.weight", .shape = {kDim}, .init = Init::Ones,
             .weight_decay = false},
            {.name = pre_ + "wa", .shape = {kHidden, kDim}},
            {.name = pre_ + "wb", .shape = {kHidden, kDim}},
            {.name = pre_ + "wout", .shape = {kDim, kHidden}, .init = Init::Normal,
             .std = 0.02f / std::sqrt(2.f * kLayers)}};
  }
  void forward(UnitCtx& c, int, const float* x, float* y) override {
    const Batch& b = *c.batch;
    const int N = b.B * b.T;
    float* h = c.saved->put(kH, size_t(N) * kDim);
    float* rstd = c.saved->put(kRstd, N);
    float* m = c.saved->put(kM, size_t(N) * kHidden);
    float* g = c.saved->put(kG, size_t(N) * kHidden);
    c.ops->rmsnorm_forward(h, rstd, x, c.param(0), N, kDim, 1e-5f);
    c.ops->linear_forward(m, h, c.param(1), nullptr, nullptr, N, kDim, kHidden);
    // m[b, t] += h[b, t-1] @ Wb^T for t >= 1: one GEMM per sequence on the shifted rows.
    for (int s = 0; s < b.B; ++s)
      c.ops->gemm(false, true, b.T - 1, kHidden, kDim, 1.f, h + size_t(s) * b.T * kDim, kDim,
                  c.param(2), kDim, 1.f, m + (size_t(s) * b.T + 1) * kHidden, kHidden);
    c.ops->gelu_forward(g, m, size_t(N) * kHidden);
    c.ops->copy(y, x, size_t(N) * kDim);
    c.ops->gemm(false, true, N, kDim, kHidden, 1.f, g, kHidden, c.param(3), kHidden, 1.f, y, kDim);
  }
  // Saved: h, rstd, m, g (forward saves them in inference too); backward's scratch: dg, dm, dh.
  ActivationDecl declare_activations(int call, BatchShape s) const override {
    if (g_undeclared) return Unit::declare_activations(call, s);  // known = false
    const size_t N = size_t(s.B) * size_t(s.T);
    ActivationDecl d;
    d.saved = (N * kDim + N + 2 * N * kHidden) * sizeof(float);
    d.saved_eval = d.saved_logits = d.saved;
    d.scratch_bwd = 2 * Scratch::bytes_for(N * kHidden) + Scratch::bytes_for(N * kDim);
    return d;
  }
  void backward(UnitCtx& c, int, const float* x, const float* dy, float* dx) override {
    const Batch& b = *c.batch;
    const int N = b.B * b.T;
    const float *h = c.saved->get(kH), *rstd = c.saved->get(kRstd);
    const float *m = c.saved->get(kM), *g = c.saved->get(kG);
    float* dg = c.scratch->f32(size_t(N) * kHidden);
    float* dm = c.scratch->f32(size_t(N) * kHidden);
    float* dh = c.scratch->f32(size_t(N) * kDim);
    c.ops->fill(dg, 0.f, size_t(N) * kHidden);
    c.ops->fill(dm, 0.f, size_t(N) * kHidden);
    c.ops->fill(dh, 0.f, size_t(N) * kDim);
    c.ops->linear_backward(dg, c.grad(3), nullptr, dy, g, c.param(3), N, kHidden, kDim);
    c.ops->gelu_backward(dm, m, dg, size_t(N) * kHidden);
    c.ops->linear_backward(dh, c.grad(1), nullptr, dm, h, c.param(1), N, kDim, kHidden);
    for (int s = 0; s < b.B; ++s) {
      const float* dms = dm + (size_t(s) * b.T + 1) * kHidden;  // rows t >= 1
      const float* hs = h + size_t(s) * b.T * kDim;             // rows t-1
      c.ops->gemm(true, false, kHidden, kDim, b.T - 1, 1.f, dms, kHidden, hs, kDim, 1.f,
                  c.grad(2), kDim);  // dWb += dm[t]^T h[t-1]
      c.ops->gemm(false, false, b.T - 1, kDim, kHidden, 1.f, dms, kHidden, c.param(2), kDim,
                  1.f, dh + size_t(s) * b.T * kDim, kDim);  // dh[t-1] += dm[t] Wb
    }
    c.ops->copy(dx, dy, size_t(N) * kDim);  // residual path
    c.ops->rmsnorm_backward(dx, c.grad(0), dh, x, c.param(0), rstd, N, kDim);
  }

 private:
  std::string pre_;
};

// ---- Tensor parallelism ----------------------------------------------------------------------
// A unit built for tensor rank k of t (Model::tensor) holds a part of some parameters
// (ParamSpec::split: the logical shape and the rows or columns it holds; the engine initialises,
// exports and imports by logical tensor) and runs on its N / t rows of the batch (sequence
// parallelism: x, y, dy, dx are this rank's rows). It exchanges activations through c.tensor,
// and declares each pass's collectives (declare_tensor_comm) so the plan lists them. Parameters
// without a split are replicated: their gradient is the SUM over tensor ranks of what each one
// adds (a unit that computes the same gradient on every rank adds it on rank 0 only).

// The rows of a (B*T) batch this rank holds, and the logical part of a tensor it keeps.
struct Rows {
  int N, n, t, k;
  size_t lo;
};
Rows rows_of(const UnitCtx& c) {
  const int t = c.tensor->size(), N = c.batch->B * c.batch->T;
  return {N, N / t, t, c.tensor->rank(), size_t(c.tensor->rank()) * size_t(N / t)};
}
ParamSpec split_rows(ParamSpec p, int k, int t) {  // rows [k r, (k+1) r) of (R, C)
  p.split.logical = p.shape;
  const int64_t r = p.shape[0] / t;
  p.split.rows = {{k * r, (k + 1) * r}};
  p.shape[0] = r;
  return p;
}
ParamSpec split_cols(ParamSpec p, int k, int t) {  // columns [k c, (k+1) c) of (R, C)
  p.split.logical = p.shape;
  const int64_t c = p.shape[1] / t;
  p.split.col_lo = k * c, p.split.col_hi = (k + 1) * c;
  p.shape[1] = c;
  return p;
}
size_t sb(size_t n) { return Scratch::bytes_for(n); }

// The embedding looks up this rank's rows; the head gathers every rank's normed rows and computes
// the whole loss on every rank (the same on each), its weight gradient added on rank 0 only.
class TensorEmbedHead final : public Unit {
 public:
  std::string name() const override { return "embed_head"; }
  std::vector<ParamSpec> params() const override { return EmbedHead().params(); }
  int num_calls() const override { return 2; }
  void forward(UnitCtx& c, int call, const float* x, float* y) override {
    const Rows r = rows_of(c);
    if (call == 0) {  // this rank's rows as one sequence of n (no positions in this model)
      c.ops->embedding_forward(y, c.batch->tokens + r.lo, c.param(0), nullptr, 1, r.n, kDim,
                               kVocab);
      return;
    }
    if (c.logits) fail("custom_model", "sampling is not split over tensor ranks");
    float* h = c.saved->put(kH, size_t(r.n) * kDim);
    float* rstd = c.saved->put(kRstd, size_t(r.n));
    c.ops->rmsnorm_forward(h, rstd, x, c.param(1), r.n, kDim, 1e-5f);
    float* hf = c.scratch->f32(size_t(r.N) * kDim);
    c.tensor->gather(TensorOp::GatherRows, hf, h, size_t(r.n) * kDim * sizeof(float));
    float* losses = c.scratch->f32(size_t(r.N));
    float* dhf = c.training ? c.scratch->f32(size_t(r.N) * kDim) : nullptr;
    if (dhf) c.ops->fill(dhf, 0.f, size_t(r.N) * kDim);
    add_loss(c, losses, dhf, dhf && r.k == 0 ? c.grad(0) : nullptr, hf, c.param(0), kDim, kVocab);
    if (dhf)  // this rank's rows of dh
      c.ops->copy(c.saved->put(kDh, size_t(r.n) * kDim), dhf + r.lo * kDim, size_t(r.n) * kDim);
  }
  void backward(UnitCtx& c, int call, const float* x, const float* dy, float* dx) override {
    const Rows r = rows_of(c);
    if (call == 0) {
      c.ops->embedding_backward(c.grad(0), nullptr, dy, c.batch->tokens + r.lo, 1, r.n, kDim);
      return;
    }
    c.ops->fill(dx, 0.f, size_t(r.n) * kDim);
    c.ops->rmsnorm_backward(dx, c.grad(1), c.saved->get(kDh), x, c.param(1),
                            c.saved->get(kRstd), r.n, kDim);
  }
  ActivationDecl declare_activations(int call, BatchShape s) const override {
    ActivationDecl d;
    if (call == 0) return d;
    const size_t N = size_t(s.B) * size_t(s.T), n = N / size_t(t_);
    d.saved = (2 * n * kDim + n) * sizeof(float);  // h, rstd, dh
    d.scratch_fwd = sb(N * kDim) + sb(N) + sb(N * kDim);
    d.saved_eval = d.saved_logits = (n * kDim + n) * sizeof(float);
    d.scratch_eval = sb(N * kDim) + sb(N);
    return d;
  }
  std::vector<TensorColl> declare_tensor_comm(int call, Pass pass, BatchShape s) const override {
    if (call == 0 || pass == Pass::Backward || pass == Pass::Recompute) return {};
    return {{TensorOp::GatherRows, int64_t(s.B) * s.T * kDim * 4}};
  }
  explicit TensorEmbedHead(int t) : t_(t) {}

 private:
  int t_;
};

// The block split the Megatron way: wa and wb column-parallel (kHidden / t rows each), wout
// row-parallel; the norm on this rank's rows, its output all-gathered before the products
// (the causal shift needs the row before, which another rank may hold) and the partial sums
// of wout reduce-scattered back to rows.
class TensorShiftMlpBlock final : public Unit {
 public:
  TensorShiftMlpBlock(int i, TensorSlice s) : base_(i), s_(s) {}
  std::string name() const override { return base_.name(); }
  std::vector<ParamSpec> params() const override {
    std::vector<ParamSpec> p = base_.params();
    p[1] = split_rows(p[1], s_.rank, s_.size);
    p[2] = split_rows(p[2], s_.rank, s_.size);
    p[3] = split_cols(p[3], s_.rank, s_.size);
    return p;
  }
  void forward(UnitCtx& c, int, const float* x, float* y) override {
    const Rows r = rows_of(c);
    const int T = c.batch->T, Hl = kHidden / r.t;
    float* h = c.saved->put(kH, size_t(r.n) * kDim);
    float* rstd = c.saved->put(kRstd, size_t(r.n));
    float* m = c.saved->put(kM, size_t(r.N) * Hl);
    float* g = c.saved->put(kG, size_t(r.N) * Hl);
    c.ops->rmsnorm_forward(h, rstd, x, c.param(0), r.n, kDim, 1e-5f);
    float* hf = c.scratch->f32(size_t(r.N) * kDim);
    c.tensor->gather(TensorOp::GatherRows, hf, h, size_t(r.n) * kDim * sizeof(float));
    c.ops->linear_forward(m, hf, c.param(1), nullptr, nullptr, r.N, kDim, Hl);
    for (int s = 0; s < c.batch->B; ++s)
      c.ops->gemm(false, true, T - 1, Hl, kDim, 1.f, hf + size_t(s) * T * kDim, kDim,
                  c.param(2), kDim, 1.f, m + (size_t(s) * T + 1) * Hl, Hl);
    c.ops->gelu_forward(g, m, size_t(r.N) * Hl);
    float* part = c.scratch->f32(size_t(r.N) * kDim);
    c.ops->linear_forward(part, g, c.param(3), nullptr, nullptr, r.N, Hl, kDim);
    c.tensor->scatter(y, part, size_t(r.n) * kDim);
    c.ops->residual_forward(y, y, x, size_t(r.n) * kDim);
  }
  void backward(UnitCtx& c, int, const float* x, const float* dy, float* dx) override {
    const Rows r = rows_of(c);
    const int T = c.batch->T, Hl = kHidden / r.t;
    const float *m = c.saved->get(kM), *g = c.saved->get(kG);
    float* dyf = c.scratch->f32(size_t(r.N) * kDim);
    c.tensor->gather(TensorOp::GatherRows, dyf, dy, size_t(r.n) * kDim * sizeof(float));
    float* hf = c.scratch->f32(size_t(r.N) * kDim);
    c.tensor->gather(TensorOp::GatherRows, hf, c.saved->get(kH), size_t(r.n) * kDim * sizeof(float));
    float* dg = c.scratch->f32(size_t(r.N) * Hl);
    float* dm = c.scratch->f32(size_t(r.N) * Hl);
    float* dhp = c.scratch->f32(size_t(r.N) * kDim);
    c.ops->fill(dg, 0.f, size_t(r.N) * Hl);
    c.ops->fill(dm, 0.f, size_t(r.N) * Hl);
    c.ops->fill(dhp, 0.f, size_t(r.N) * kDim);
    c.ops->linear_backward(dg, c.grad(3), nullptr, dyf, g, c.param(3), r.N, Hl, kDim);
    c.ops->gelu_backward(dm, m, dg, size_t(r.N) * Hl);
    c.ops->linear_backward(dhp, c.grad(1), nullptr, dm, hf, c.param(1), r.N, kDim, Hl);
    for (int s = 0; s < c.batch->B; ++s) {
      const float* dms = dm + (size_t(s) * T + 1) * Hl;
      const float* hs = hf + size_t(s) * T * kDim;
      c.ops->gemm(true, false, Hl, kDim, T - 1, 1.f, dms, Hl, hs, kDim, 1.f, c.grad(2), kDim);
      c.ops->gemm(false, false, T - 1, kDim, Hl, 1.f, dms, Hl, c.param(2), kDim, 1.f,
                  dhp + size_t(s) * T * kDim, kDim);
    }
    float* dh = c.scratch->f32(size_t(r.n) * kDim);
    c.tensor->scatter(dh, dhp, size_t(r.n) * kDim);
    if (dx != dy) c.ops->copy(dx, dy, size_t(r.n) * kDim);
    c.ops->rmsnorm_backward(dx, c.grad(0), dh, x, c.param(0), c.saved->get(kRstd), r.n, kDim);
  }
  ActivationDecl declare_activations(int, BatchShape s) const override {
    const size_t N = size_t(s.B) * size_t(s.T), n = N / size_t(s_.size),
                 Hl = size_t(kHidden / s_.size);
    ActivationDecl d;
    d.saved = (n * kDim + n + 2 * N * Hl) * sizeof(float);
    d.saved_eval = d.saved_logits = d.saved;
    d.scratch_fwd = d.scratch_eval = d.scratch_logits = 2 * sb(N * kDim);
    d.scratch_bwd = 3 * sb(N * kDim) + 2 * sb(N * Hl) + sb(n * kDim);
    return d;
  }
  std::vector<TensorColl> declare_tensor_comm(int, Pass pass, BatchShape s) const override {
    const int64_t full = int64_t(s.B) * s.T * kDim * 4;
    const TensorColl gather{TensorOp::GatherRows, full}, scatter{TensorOp::ScatterRows, full};
    if (pass == Pass::Backward) return {gather, gather, scatter};
    if (pass == Pass::Recompute) return {};
    return {gather, scatter};
  }

 private:
  ShiftMlpBlock base_;
  TensorSlice s_;
};

Model make_model(TensorSlice slice = {}) {
  Model m;
  m.config.type = "custom";
  m.config.vocab_size = kVocab;
  m.config.d_model = kDim;
  m.config.n_layer = kLayers;
  m.tensor = slice;
  if (slice.size > 1)
    m.units.push_back(std::make_unique<TensorEmbedHead>(slice.size));
  else
    m.units.push_back(std::make_unique<EmbedHead>());
  m.schedule.push_back({0, 0});
  for (int i = 0; i < kLayers; ++i) {
    if (slice.size > 1)
      m.units.push_back(std::make_unique<TensorShiftMlpBlock>(i, slice));
    else
      m.units.push_back(std::make_unique<ShiftMlpBlock>(i));
    m.schedule.push_back({i + 1, 0});
  }
  m.schedule.push_back({0, 1});
  return m;
}

// A learnable synthetic language: the next token takes its high three bits from the current
// token and its low three bits from the one before (so it needs the causal shift to learn).
void make_batch(int B, int T, uint64_t seed, std::vector<int32_t>& tok, std::vector<int32_t>& tgt) {
  Rng rng(seed);
  tok.assign(size_t(B) * T, 0);
  tgt.assign(size_t(B) * T, 0);
  for (int b = 0; b < B; ++b) {
    int p2 = static_cast<int>(rng.below(kVocab)), p1 = static_cast<int>(rng.below(kVocab));
    for (int t = 0; t < T; ++t) {
      const int next = (p1 / 8) * 8 + (p2 % 8);  // high bits from t, low bits from t-1
      tok[size_t(b) * T + t] = p1;
      tgt[size_t(b) * T + t] = next;
      p2 = p1;
      p1 = next;
    }
  }
}

// The same language as one token stream, in segments of 64 that restart from random tokens,
// written as an llm.c token file (what `shardwise data prepare` writes: a header of 256 int32,
// magic 20240520, version 1, the count; then uint16 tokens).
void write_language(const std::string& path, int tokens, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint16_t> data;
  int p2 = 0, p1 = 0;
  for (int i = 0; i < tokens; ++i) {
    if (i % 64 == 0) p2 = int(rng.below(kVocab)), p1 = int(rng.below(kVocab));
    data.push_back(uint16_t(p1));
    const int next = (p1 / 8) * 8 + (p2 % 8);
    p2 = p1, p1 = next;
  }
  int32_t header[256] = {20240520, 1, tokens};
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header), sizeof header);
  f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size() * 2));
  if (!f) fail("custom_model", path + ": cannot write the token file");
}

// Trains the model with sw::Trainer on the synthetic language: the config made in code, the
// model given as a factory (called for each tensor slice; here always the whole model).
int train_language(int steps, std::string dir) {
  namespace fs = std::filesystem;
  if (dir.empty()) dir = (fs::temp_directory_path() / "shardwise_custom_model").string();
  fs::create_directories(dir);
  // (each process its own copy of the data: every rank of an mpirun reads the same tokens)
  const std::string data = (fs::path(dir) / ("language_" + std::to_string(getpid()) + ".bin")).string();
  write_language(data, 1 << 16, 7);
  RunConfig cfg;
  cfg.set("model.vocab_size", kVocab).set("model.seq_len", 32).set("data.train", data)
      .set("train_micro_batch_size_per_gpu", 8).set("train_steps", steps).set("seed", 42)
      .set("optimizer.params.lr", 3e-3).set("optimizer.params.weight_decay", 0.0)
      .set("scheduler.type", "Constant").set("run_dir", dir);
  TrainerOptions opts;
  opts.progress = false;
  Trainer trainer(cfg, [](const TensorSlice& s) { return make_model(s); }, opts);
  double first = 0;
  trainer.on_step([&](const StepInfo& s) {
    if (s.step == 1) first = s.loss;
    if (s.step % 50 == 0 || s.step == 1)
      std::printf("step %4d  loss %.4f  grad_norm %.3f\n", s.step, s.loss, s.grad_norm);
    return StepAction::Continue;
  });
  const RunSummary& r = trainer.train();
  fs::remove(data);
  std::printf("loss %.4f -> %.4f (uniform guess: %.4f); weights in %s\n", first, r.last_loss,
              std::log(double(kVocab)), r.weights_path.c_str());
  return r.last_loss < 0.5 * first ? 0 : 1;
}

int gradcheck(ShardedModel& sm, const Batch& batch) {
  // Analytic gradients of the mean loss, copied out per parameter.
  sm.zero_grads();
  sm.forward_backward(batch, 1.f);
  std::vector<std::string> names;
  std::vector<std::vector<float>> values, grads;
  sm.for_each_param([&](const ParamSpec& s, const float* p) {
    names.push_back(s.name);
    values.emplace_back(p, p + numel(s.shape));
  });
  sm.for_each_grad([&](const ParamSpec& s, const float* g) { grads.emplace_back(g, g + numel(s.shape)); });
  int bad = 0;
  for (size_t k = 0; k < names.size(); ++k) {
    std::vector<float>& v = values[k];
    for (int probe = 0; probe < 3; ++probe) {
      const size_t i = (probe * 7919u) % v.size();
      const float h = 1e-2f, v0 = v[i];
      auto loss_at = [&](float x) {
        v[i] = x;
        sm.set_param(names[k], v.data(), static_cast<int64_t>(v.size()));
        return sm.eval_loss(batch);
      };
      const double num = (loss_at(v0 + h) - loss_at(v0 - h)) / (2.0 * h);
      loss_at(v0);
      const double ana = grads[k][i];
      const double err = std::fabs(ana - num) / std::max({std::fabs(ana), std::fabs(num), 1e-3});
      std::printf("gradcheck %-22s [%6zu] analytic %+.6e numeric %+.6e err %.2e\n",
                  names[k].c_str(), i, ana, num, err);
      if (err > 5e-2) ++bad;
    }
  }
  std::printf("gradcheck: %s\n", bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}

// Runs every call of every unit once per call kind (models/activation_check.h) and compares
// what it allocated with its declaration. Returns the number of mismatches.
int check_activations(Model& m, const Batch& batch) {
  int bad = 0;
  Scratch scratch;
  const size_t n = size_t(batch.B) * batch.T * kDim;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = 0.01f * float(i % 97) - 0.4f;
  for (size_t p = 0; p < m.schedule.size(); ++p) {
    const Call& c = m.schedule[p];
    Unit& u = *m.units[size_t(c.unit)];
    std::vector<float> pmem, gmem;
    std::vector<float*> ps, gs;
    size_t total = 0;
    for (const ParamSpec& s : u.params()) total += size_t(numel(s.shape));
    pmem.assign(total, 0.02f);
    gmem.assign(total, 0.f);
    total = 0;
    for (const ParamSpec& s : u.params()) {
      ps.push_back(pmem.data() + total);
      gs.push_back(gmem.data() + total);
      total += size_t(numel(s.shape));
    }
    ActivationProbe pr;
    pr.ops = &ops_for(Device::cpu());
    pr.batch = &batch;
    pr.params = &ps;
    pr.grads = &gs;
    pr.x = p > 0 ? x.data() : nullptr;
    pr.d_model = kDim;
    pr.loss_call = p + 1 == m.schedule.size();
    pr.vocab = kVocab;
    const ActivationDecl want = u.declare_activations(c.call, {batch.B, batch.T});
    const ActivationDecl got = measure_activations(u, c.call, pr, scratch);
    const size_t w[] = {want.saved, want.saved_cheap, want.scratch_fwd, want.scratch_bwd,
                        want.scratch_recompute, want.saved_eval, want.scratch_eval,
                        want.saved_logits, want.scratch_logits};
    const size_t g[] = {got.saved, got.saved_cheap, got.scratch_fwd, got.scratch_bwd,
                        got.scratch_recompute, got.saved_eval, got.scratch_eval,
                        got.saved_logits, got.scratch_logits};
    const char* names[] = {"saved", "saved_cheap", "scratch_fwd", "scratch_bwd",
                           "scratch_recompute", "saved_eval", "scratch_eval", "saved_logits",
                           "scratch_logits"};
    for (size_t k = 0; k < std::size(w); ++k) {
      const bool ok = want.known && w[k] == g[k];
      bad += !ok;
      std::printf("activations %-12s call %d %-17s declared %8zu measured %8zu %s\n",
                  u.name().c_str(), c.call, names[k], w[k], g[k], ok ? "ok" : "MISMATCH");
    }
  }
  std::printf("check-activations: %s\n", bad ? "FAILED" : "ok");
  return bad;
}

}  // namespace

// The planner on this model (planner/search.h predict_plan): one line per figure, or one
// error line naming the first unit that does not declare its activation sizes.
int plan(int world, bool measure_unknown) {
  PlanSetup s;
  s.model = make_model().config;
  s.model.seq_len = 32;
  s.world = world;
  s.micro_batch = 8;
  try {
    const PlanPrediction p = predict_plan(make_model(), s, nullptr, measure_unknown);
    for (const UndeclaredCall& u : p.measured)
      std::printf("measured %s call %d (it does not declare its activation sizes)\n",
                  u.name.c_str(), u.call);
    std::printf("plan: %d rank%s, device peak %lld bytes (activations %lld), kernel workspace "
                "%lld, rss %lld\n",
                world, world == 1 ? "" : "s", static_cast<long long>(p.peak.total),
                static_cast<long long>(p.peak.at_peak[size_t(Mem::Activations)]),
                static_cast<long long>(p.workspace), static_cast<long long>(p.rss.total));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

// --tensor t: the model split over the t ranks of mpirun, trained beside the whole model alone
// on every rank; the losses must agree.
int tensor_run(int t, int steps) {
  const GroupPtr world = world_group();
  if (world->size() != t)
    fail("custom_model", "--tensor " + std::to_string(t) + ": run it under mpirun -np " +
                             std::to_string(t) + " (this job has " +
                             std::to_string(world->size()) + " ranks)");
  Model split = make_model(TensorSlice{world->rank(), t});
  Model whole = make_model();
  ShardedModel sm(split, ops_for(Device::cpu()), 42, make_local_group(),
                  ShardingPolicy::for_strategy(ShardingStrategy::FullShard), world);
  ShardedModel one(whole, ops_for(Device::cpu()), 42);
  AdamWParams opt;
  opt.weight_decay = 0.0f;
  std::vector<int32_t> tok, tgt;
  double worst = 0;
  for (int s = 1; s <= steps; ++s) {
    make_batch(8, 32, s, tok, tgt);
    const Batch batch{tok.data(), tgt.data(), 8, 32};
    double loss[2];
    ShardedModel* models[2] = {&sm, &one};
    for (int k = 0; k < 2; ++k) {
      models[k]->zero_grads();
      loss[k] = models[k]->forward_backward(batch, 1.f);
      const double norm = models[k]->grad_norm();
      models[k]->optimizer_step(opt, 3e-3f, norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.f, s);
    }
    worst = std::max(worst, std::fabs(loss[0] - loss[1]) / std::fabs(loss[1]));
    if (world->rank() == 0 && (s % 50 == 0 || s == 1))
      std::printf("step %4d  loss %.6f (whole model alone %.6f)\n", s, loss[0], loss[1]);
  }
  if (world->rank() == 0)
    std::printf("tensor %d: largest relative loss difference %.2e over %d steps\n", t, worst, steps);
  return worst < 1e-5 ? 0 : 1;
}

int main(int argc, char** argv) {
  int steps = 300, world = 1, tensor = 0;
  std::string run_dir;
  bool check = false, check_act = false, plan_only = false, measure_unknown = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--world-size") && i + 1 < argc) world = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--run-dir") && i + 1 < argc) run_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--gradcheck")) check = true;
    else if (!std::strcmp(argv[i], "--check-activations")) check_act = true;
    else if (!std::strcmp(argv[i], "--plan")) plan_only = true;
    else if (!std::strcmp(argv[i], "--undeclared")) g_undeclared = true;
    else if (!std::strcmp(argv[i], "--measure-unknown")) measure_unknown = true;
    else if (!std::strcmp(argv[i], "--tensor") && i + 1 < argc) tensor = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "custom_model: unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  if (plan_only) return plan(world, measure_unknown);
  if (tensor > 0) try {
      return tensor_run(tensor, steps);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
  Model model = make_model();
  if (check_act) {  // odd batch shapes on purpose: declarations must hold for any (B, T)
    std::vector<int32_t> tok, tgt;
    int bad = 0;
    for (auto [B, T] : {std::pair{1, 1}, std::pair{3, 5}, std::pair{2, 8}}) {
      make_batch(B, T, 1, tok, tgt);
      bad += check_activations(model, Batch{tok.data(), tgt.data(), B, T});
    }
    return bad ? 1 : 0;
  }
  if (check) {
    ShardedModel sm(model, ops_for(Device::cpu()), /*seed=*/42);
    std::printf("custom model: %lld parameters in %zu units\n",
                static_cast<long long>(sm.num_params()), model.units.size());
    std::vector<int32_t> tok, tgt;
    make_batch(2, 8, 1, tok, tgt);
    Batch batch{tok.data(), tgt.data(), 2, 8};
    return gradcheck(sm, batch);
  }
  try {
    return train_language(steps, run_dir);
  } catch (const Error& e) {
    std::fprintf(stderr, "custom_model: %s\n", e.what());
    return 1;
  }
}
