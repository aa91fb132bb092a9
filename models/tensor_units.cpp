// Tensor-parallel units (docs/ARCHITECTURE.md, "Tensor parallelism"): GPT-2 and Llama built for
// tensor rank k of t, after Megatron-LM's splits with sequence parallelism.
//
// Shapes: B batch, T time, N = B*T rows, n = N/t the rows of this rank (rows [k n, (k+1) n) of
// the flattened batch: sequence parallel), C d_model, H heads (Hl = H/t here), hd = C/H,
// Cl = Hl*hd, F d_ff (Fl = F/t), V vocab (Vl = V/t: rows [k Vl, (k+1) Vl) of the table).
//
// A block: x (n,C) -> norm -> all-gather rows (N,C) -> column-parallel q|k|v (N, 3Cl) ->
// attention over its heads -> row-parallel output (N,C) partial sums -> reduce-scatter rows
// (n,C) -> + bias (rank 0's product adds it) + x = x2 -> norm -> all-gather -> column-parallel
// fc (N,Fl) -> GELU / SwiGLU -> row-parallel proj -> reduce-scatter -> + x2 = y (n,C).
// Norms and residual adds run on this rank's n rows, so the residual stream, the norms' outputs
// and statistics kept for backward are 1/t of the batch's; what lives between the gathers and
// the scatters is 1/t by heads or by d_ff. Backward gathers dy and the kept norm outputs again
// (their local rows are kept, not the gathered ones: Megatron's sequence-parallel choice).
//
// The embedding is vocabulary-parallel: each rank looks up the tokens of its rows of the table
// (zeros elsewhere) for all N rows and a reduce-scatter sums them into its n rows; GPT-2's
// positions are added there. The LM head is vocabulary-parallel too, with a parallel
// cross-entropy that never gathers the logits: per row each rank's max, sum of exponentials and
// target logit (Ops::xent_shard_stats) are all-gathered and combined the same way on every rank
// (xent_shard_combine), then each rank's columns give their part of dh, reduce-scattered to the
// rows (xent_shard_backward).
//
// Parameters not split (norms, GPT-2's positions and row-parallel biases) are replicated: each
// rank's gradient covers its rows only, and the engine sums them over the tensor group
// (tp_reduce_grads). Row-parallel biases are added by rank 0's product only, so their
// gradient comes from rank 0 (the others' stay zero) before that sum.
#include <cmath>

#include "core/error.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/packed.h"
#include "models/tensor_units.h"
#include "models/unit_helpers.h"

namespace sw {

namespace {

using namespace units;


ParamSpec spec(std::string name, Shape shape, Init init, float std, std::string hf,
               bool hf_t = false) {
  return param_spec(std::move(name), std::move(shape), init, std, std::move(hf), hf_t);
}
// Rows [lo, hi) of a logical tensor (its local shape: those rows).
ParamSpec rows(ParamSpec p, std::vector<std::array<int64_t, 2>> runs) {
  p.split.logical = p.shape;
  int64_t n = 0;
  for (const auto& r : runs) n += r[1] - r[0];
  p.shape[0] = n;
  p.split.rows = std::move(runs);
  return p;
}
// Columns [lo, hi) of a logical (rows, cols) tensor.
ParamSpec cols(ParamSpec p, int64_t lo, int64_t hi) {
  p.split.logical = p.shape;
  p.shape[1] = hi - lo;
  p.split.col_lo = lo;
  p.split.col_hi = hi;
  return p;
}

// The slice of the batch this rank works on.
struct Dims {
  int B, T, N, n, t, k;
  int64_t row_lo;
};
Dims dims(const UnitCtx& ctx) {
  const int t = ctx.tensor ? ctx.tensor->size() : 1, k = ctx.tensor ? ctx.tensor->rank() : 0;
  const int N = ctx.batch->B * ctx.batch->T;
  SW_CHECK(N % t == 0, "tensor parallel: B*T not divisible by the tensor degree");
  return {ctx.batch->B, ctx.batch->T, N, N / t, t, k, int64_t{k} * (N / t)};
}
Dims dims(BatchShape s, int t) {
  const int N = s.B * s.T;
  return {s.B, s.T, N, N / t, t, 0, 0};
}

// Gathered rows of a ProductIn kept locally (n rows of width C): a fresh (N,C) scratch
// ProductIn holding every rank's rows.
ProductIn gather_input(UnitCtx& ctx, ProductIn mine, size_t n_local, size_t n_full) {
  const ProductIn full = scratch_input(*ctx.scratch, n_full, *ctx.ops);
  if (full.lp)
    ctx.tensor->gather(TensorOp::GatherRows, full.lp, mine.lp, n_local * 2);
  else
    ctx.tensor->gather(TensorOp::GatherRows, full.f32, mine.f32, n_local * 4);
  return full;
}
float* gather_f32(UnitCtx& ctx, const float* mine, size_t n_local, size_t n_full) {
  float* full = ctx.scratch->f32(n_full);
  ctx.tensor->gather(TensorOp::GatherRows, full, mine, n_local * 4);
  return full;
}
TensorColl gather_coll(size_t full_values, size_t elem) {
  return {TensorOp::GatherRows, static_cast<int64_t>(full_values * elem)};
}
TensorColl scatter_coll(size_t full_values) {
  return {TensorOp::ScatterRows, static_cast<int64_t>(full_values * 4)};
}

// A block's collectives (GPT-2's and Llama's alike). Forward: the norm's rows gathered before
// the attention's column product, its row product's partial sums scattered, the same for the
// MLP (a ProductIn's elements: 2 bytes with 16-bit products). Backward: dy gathered, the MLP
// norm's rows again, its input gradient scattered, dL/dx2 gathered, the attention norm's rows,
// its input gradient scattered. A selective recompute needs none (norms and activations of
// this rank's rows or columns).
std::vector<TensorColl> block_comm(const ModelConfig& c, Unit::Pass pass, BatchShape shape,
                                   int t) {
  const Dims d = dims(shape, t);
  const size_t NC = sz(d.N, c.d_model), e = shape.lowp() ? 2 : 4;
  switch (pass) {
    case Unit::Pass::Forward:
    case Unit::Pass::Eval:
    case Unit::Pass::Logits:
      return {gather_coll(NC, e), scatter_coll(NC), gather_coll(NC, e), scatter_coll(NC)};
    case Unit::Pass::Backward:
      return {gather_coll(NC, 4), gather_coll(NC, e), scatter_coll(NC),
              gather_coll(NC, 4), gather_coll(NC, e), scatter_coll(NC)};
    case Unit::Pass::Recompute:
      return {};
  }
  return {};
}

// ---- The vocabulary-parallel embedding (GPT-2 adds positions) --------------------------------
// y(n,C) = sum over ranks of their table rows' lookups, rows of this rank (+ wpe).
void embed_forward(UnitCtx& ctx, const ModelConfig& c, size_t table, int wpe, float* y) {
  const Ops& ops = *ctx.ops;
  const Dims d = dims(ctx);
  const int C = c.d_model, Vl = c.vocab_size / d.t;
  if (d.T > c.seq_len)
    fail("model", "batch sequence length " + std::to_string(d.T) + " exceeds model.seq_len = " +
                      std::to_string(c.seq_len));
  ScratchScope guard{ctx.scratch};
  float* part = ctx.scratch->f32(sz(d.N, C));
  ops.vocab_embedding_forward(part, ctx.batch->tokens, ctx.weight(table), int64_t{d.k} * Vl, d.N,
                              C, Vl);
  ctx.tensor->scatter(y, part, sz(d.n, C));
  if (wpe >= 0) ops.position_forward(y, ctx.param(size_t(wpe)), d.row_lo, d.n, d.T, C);
}
void embed_backward(UnitCtx& ctx, const ModelConfig& c, size_t table, int wpe, const float* dy) {
  const Ops& ops = *ctx.ops;
  const Dims d = dims(ctx);
  const int C = c.d_model, Vl = c.vocab_size / d.t;
  ScratchScope guard{ctx.scratch};
  if (wpe >= 0) ops.position_backward(ctx.grad(size_t(wpe)), dy, d.row_lo, d.n, d.T, C);
  const float* full = gather_f32(ctx, dy, sz(d.n, C), sz(d.N, C));
  ops.vocab_embedding_backward(ctx.grad(table), full, ctx.batch->tokens, int64_t{d.k} * Vl, d.N,
                               C, Vl);
}
std::vector<TensorColl> embed_comm(const ModelConfig& c, Unit::Pass pass, BatchShape s, int t) {
  const Dims d = dims(s, t);
  const size_t NC = sz(d.N, c.d_model);
  if (pass == Unit::Pass::Backward) return {gather_coll(NC, 4)};
  if (pass == Unit::Pass::Recompute) return {};
  return {scatter_coll(NC)};
}
ActivationDecl embed_decl(const ModelConfig& c, BatchShape s, int t) {
  const Dims d = dims(s, t);
  ActivationDecl a;
  a.scratch_fwd = a.scratch_eval = a.scratch_logits = scrb(sz(d.N, c.d_model));
  a.scratch_bwd = scrb(sz(d.N, c.d_model));
  return a;
}

// ---- The vocabulary-parallel LM head and cross-entropy ----------------------------------------
namespace head {
constexpr SavedSlot<float> kH{0, Keep::Always, "h"}, kMean{1, Keep::Always, "h_mean"},
    kRstd{2, Keep::Always, "h_rstd"}, kDh{3, Keep::Always, "dh"};
}  // namespace head

// norm: GPT-2's LayerNorm (w, b) or Llama's RMSNorm (w, b < 0).
struct HeadParams {
  size_t lm, nw;
  int nb;  // -1: RMSNorm
};

void head_forward(UnitCtx& ctx, const ModelConfig& c, HeadParams hp, const float* x) {
  const Ops& ops = *ctx.ops;
  const Dims d = dims(ctx);
  const int C = c.d_model, Vl = c.vocab_size / d.t;
  ScratchScope guard{ctx.scratch};
  if (!ctx.training && ctx.logits)
    fail("model", "tensor parallelism: sampling (the last position's logits) is not supported "
                  "with parallelism.tensor_parallel_degree > 1");
  SW_CHECK(ctx.batch->targets != nullptr, "a loss call needs targets");
  float* h = keep(ctx, head::kH, sz(d.n, C));
  const bool ln = hp.nb >= 0;
  float* mean = ln ? keep(ctx, head::kMean, sz(d.n)) : nullptr;
  float* rstd = keep(ctx, head::kRstd, sz(d.n));
  if (ln)
    ops.layernorm_forward(h, mean, rstd, x, ctx.param(hp.nw), ctx.param(size_t(hp.nb)), d.n, C);
  else
    ops.rmsnorm_forward(h, rstd, x, ctx.param(hp.nw), d.n, C, c.norm_eps);
  const float* hf = gather_f32(ctx, h, sz(d.n, C), sz(d.N, C));
  float* stats = ctx.scratch->f32(sz(d.N, 3));
  const Operand w = ctx.weight(hp.lm);
  const int64_t v_lo = int64_t{d.k} * Vl;
  ops.xent_shard_stats(stats, hf, w, ctx.batch->targets, v_lo, d.N, C, Vl);
  float* all = ctx.scratch->f32(sz(d.t, sz(d.N, 3)));
  ctx.tensor->gather(TensorOp::AllGather, all, stats, f32b(sz(d.N, 3)));
  float* lse = ctx.scratch->f32(sz(d.N));
  float* losses = ctx.scratch->f32(sz(d.N));
  ops.xent_shard_combine(ctx.loss_total ? ctx.loss_total : &ctx.loss_sum, lse, losses, all,
                         ctx.batch->targets, d.t, d.N);
  ctx.loss_count += count_targets(*ctx.batch);
  if (!ctx.training) return;
  SW_CHECK(ctx.grads != nullptr,
           "tensor parallel: the loss call's training forward runs with its gradients");
  float* part = ctx.scratch->f32(sz(d.N, C));
  ops.fill(part, 0.f, sz(d.N, C));
  ops.xent_shard_backward(part, ctx.grad_out(hp.lm), hf, w, lse, ctx.batch->targets, v_lo, d.N, C,
                          Vl, ctx.grad_scale);
  ctx.tensor->scatter(ctx.saved->put(head::kDh, sz(d.n, C)), part, sz(d.n, C));
}
void head_backward(UnitCtx& ctx, const ModelConfig& c, HeadParams hp, const float* x,
                   float* dx) {
  const Ops& ops = *ctx.ops;
  const Dims d = dims(ctx);
  const int C = c.d_model;
  const Saved& s = *ctx.saved;
  ops.fill(dx, 0.f, sz(d.n, C));
  if (hp.nb >= 0)
    layernorm_backward_resid(ctx, dx, ctx.grad(hp.nw), ctx.grad(size_t(hp.nb)), s.get(head::kDh),
                             x, ctx.param(hp.nw), s.get(head::kMean), s.get(head::kRstd), d.n, C);
  else
    rmsnorm_backward_resid(ctx, dx, ctx.grad(hp.nw), s.get(head::kDh), x, ctx.param(hp.nw),
                           s.get(head::kRstd), d.n, C);
}
std::vector<TensorColl> head_comm(const ModelConfig& c, Unit::Pass pass, BatchShape s, int t) {
  const Dims d = dims(s, t);
  const size_t NC = sz(d.N, c.d_model);
  if (pass == Unit::Pass::Backward || pass == Unit::Pass::Recompute) return {};
  std::vector<TensorColl> v = {gather_coll(NC, 4),
                               {TensorOp::AllGather, static_cast<int64_t>(f32b(sz(d.t, sz(d.N, 3))))}};
  if (pass == Unit::Pass::Forward) v.push_back(scatter_coll(NC));
  return v;
}
ActivationDecl head_decl(const ModelConfig& c, BatchShape s, int t, bool layernorm) {
  const Dims d = dims(s, t);
  const size_t n = sz(d.n), N = sz(d.N), C = size_t(c.d_model);
  const size_t stats = (layernorm ? 2 : 1) * n;
  ActivationDecl a;
  a.saved = f32b(n * C) + f32b(stats) + f32b(n * C);  // h, statistics, dh
  // the gathered h, stats, every rank's stats, lse, losses (+ the partial dh in training)
  const size_t common = scrb(N * C) + scrb(N * 3) + scrb(size_t(d.t) * N * 3) + 2 * scrb(N);
  a.scratch_fwd = common + scrb(N * C);
  a.scratch_eval = scrb(n * C) + (layernorm ? 2 : 1) * scrb(n) + common;
  a.scratch_logits = a.scratch_eval;
  return a;
}

// ---- GPT-2 ------------------------------------------------------------------------------------
// embed_head: 0 wte (Vl,C) rows; 1 wpe (maxT,C); 2 ln_f.weight; 3 ln_f.bias; [4 lm_head (Vl,C)]
class Gpt2EmbedHead final : public Unit {
 public:
  Gpt2EmbedHead(const ModelConfig& c, TensorSlice s) : c_(c), s_(s) {}
  std::string name() const override { return "embed_head"; }
  int num_calls() const override { return 2; }
  std::vector<ParamSpec> params() const override {
    const int64_t V = c_.vocab_size, C = c_.d_model, Vl = V / s_.size, lo = Vl * s_.rank;
    std::vector<ParamSpec> p = {
        rows(product_weight(spec("wte", {V, C}, Init::Normal, 0.02f, "wte.weight")),
             {{lo, lo + Vl}}),
        spec("wpe", {c_.seq_len, C}, Init::Normal, 0.02f, "wpe.weight"),
        spec("ln_f.weight", {C}, Init::Ones, 0.f, "ln_f.weight"),
        spec("ln_f.bias", {C}, Init::Zeros, 0.f, "ln_f.bias"),
    };
    if (!c_.tied())
      p.push_back(rows(product_weight(spec("lm_head.weight", {V, C}, Init::Normal, 0.02f,
                                           "lm_head.weight")),
                       {{lo, lo + Vl}}));
    return p;
  }
  void forward(UnitCtx& ctx, int call, const float* x, float* y) override {
    if (call == 0) return embed_forward(ctx, c_, 0, 1, y);
    head_forward(ctx, c_, hp(), x);
  }
  void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) override {
    if (call == 0) return embed_backward(ctx, c_, 0, 1, dy);
    head_backward(ctx, c_, hp(), x, dx);
  }
  ActivationDecl declare_activations(int call, BatchShape s) const override {
    return call == 0 ? embed_decl(c_, s, s_.size) : head_decl(c_, s, s_.size, true);
  }
  std::vector<TensorColl> declare_tensor_comm(int call, Pass pass, BatchShape s) const override {
    return call == 0 ? embed_comm(c_, pass, s, s_.size) : head_comm(c_, pass, s, s_.size);
  }

 private:
  HeadParams hp() const { return {c_.tied() ? size_t{0} : size_t{4}, 2, 3}; }
  ModelConfig c_;
  TensorSlice s_;
};


namespace gpt2 = units::gpt2_block;

class Gpt2Block final : public Unit {
 public:
  Gpt2Block(const ModelConfig& c, int layer, TensorSlice s) : c_(c), layer_(layer), s_(s) {}
  std::string name() const override { return "h." + std::to_string(layer_); }

  // The replicated parameters first (one run to sum over the tensor group), then the split ones.
  enum : size_t { LN1W, LN1B, PROJB, LN2W, LN2B, FCPROJB, QKVW, QKVB, PROJW, FCW, FCB, FCPROJW };

  std::vector<ParamSpec> params() const override {
    const int64_t C = c_.d_model, F = c_.d_ff, t = s_.size, k = s_.rank;
    const int64_t Cl = C / t, Fl = F / t;
    const std::string n = name() + ".";
    const float res_std = 0.02f / std::sqrt(2.f * static_cast<float>(c_.n_layer));
    const std::vector<std::array<int64_t, 2>> qkv_rows = {
        {k * Cl, (k + 1) * Cl}, {C + k * Cl, C + (k + 1) * Cl}, {2 * C + k * Cl, 2 * C + (k + 1) * Cl}};
    return {
        spec(n + "ln_1.weight", {C}, Init::Ones, 0.f, n + "ln_1.weight"),
        spec(n + "ln_1.bias", {C}, Init::Zeros, 0.f, n + "ln_1.bias"),
        spec(n + "attn.c_proj.bias", {C}, Init::Zeros, 0.f, n + "attn.c_proj.bias"),
        spec(n + "ln_2.weight", {C}, Init::Ones, 0.f, n + "ln_2.weight"),
        spec(n + "ln_2.bias", {C}, Init::Zeros, 0.f, n + "ln_2.bias"),
        spec(n + "mlp.c_proj.bias", {C}, Init::Zeros, 0.f, n + "mlp.c_proj.bias"),
        rows(linear_weight(spec(n + "attn.c_attn.weight", {3 * C, C}, Init::Normal, 0.02f,
                                 n + "attn.c_attn.weight", true)),
             qkv_rows),
        rows(spec(n + "attn.c_attn.bias", {3 * C}, Init::Zeros, 0.f, n + "attn.c_attn.bias"),
             qkv_rows),
        cols(linear_weight(spec(n + "attn.c_proj.weight", {C, C}, Init::Normal, res_std,
                                 n + "attn.c_proj.weight", true)),
             k * Cl, (k + 1) * Cl),
        rows(linear_weight(spec(n + "mlp.c_fc.weight", {F, C}, Init::Normal, 0.02f,
                                 n + "mlp.c_fc.weight", true)),
             {{k * Fl, (k + 1) * Fl}}),
        rows(spec(n + "mlp.c_fc.bias", {F}, Init::Zeros, 0.f, n + "mlp.c_fc.bias"),
             {{k * Fl, (k + 1) * Fl}}),
        cols(linear_weight(spec(n + "mlp.c_proj.weight", {C, F}, Init::Normal, res_std,
                                 n + "mlp.c_proj.weight", true)),
             k * Fl, (k + 1) * Fl),
    };
  }

  void forward(UnitCtx& ctx, int, const float* x, float* y) override {
    using namespace gpt2;
    const Ops& ops = *ctx.ops;
    const Dims d = dims(ctx);
    const int C = c_.d_model, Hl = c_.n_head / d.t, hd = C / c_.n_head, Cl = Hl * hd,
              Fl = c_.d_ff / d.t, N = d.N, n = d.n;
    ScratchScope guard{ctx.scratch};
    auto P = [&](size_t i) { return ctx.param(i); };
    auto W = [&](size_t i) { return ctx.weight(i); };
    const bool lead = d.k == 0;  // adds the row-parallel biases

    const ProductIn ln1 = keep_input(ctx, kLn1, sz(n, C));
    float* ln1_mean = keep(ctx, kLn1Mean, sz(n));
    float* ln1_rstd = keep(ctx, kLn1Rstd, sz(n));
    const ProductIn qkv = keep_input(ctx, kQkv, sz(N, 3 * Cl));
    const ProductIn atty = keep_input(ctx, kAtty, sz(N, Cl));
    float* lse = keep(ctx, kLse, sz(d.B, int64_t{Hl} * d.T));
    float* x2 = keep(ctx, kX2, sz(n, C));
    const ProductIn ln2 = keep_input(ctx, kLn2, sz(n, C));
    float* ln2_mean = keep(ctx, kLn2Mean, sz(n));
    float* ln2_rstd = keep(ctx, kLn2Rstd, sz(n));
    const ProductIn fch = keep_input(ctx, kFch, sz(N, Fl));
    const ProductIn fch_gelu = keep_input(ctx, kFchGelu, sz(N, Fl));

    ops.layernorm_forward(ln1.out(), ln1_mean, ln1_rstd, x, P(LN1W), P(LN1B), n, C);
    const ProductIn ln1f = gather_input(ctx, ln1, sz(n, C), sz(N, C));
    if (qkv.lp) {
      float* q32 = ctx.scratch->f32(sz(N, 3 * Cl));
      ops.linear_forward(q32, ln1f.operand(), W(QKVW), P(QKVB), nullptr, N, C, 3 * Cl);
      ops.narrow(ops.compute(), q32, qkv.lp, sz(N, 3 * Cl));
    } else {
      ops.linear_forward(qkv.f32, ln1f.operand(), W(QKVW), P(QKVB), nullptr, N, C, 3 * Cl);
    }
    ops.attention_forward(atty.out(), lse, qkv.operand(), d.B, d.T, Hl, Hl, hd);
    float* part = ctx.scratch->f32(sz(N, C));
    ops.linear_forward(part, atty.operand(), W(PROJW), lead ? P(PROJB) : nullptr, nullptr, N, Cl,
                       C);
    ctx.tensor->scatter(x2, part, sz(n, C));
    ops.residual_forward(x2, x2, x, sz(n, C));
    ops.layernorm_forward(ln2.out(), ln2_mean, ln2_rstd, x2, P(LN2W), P(LN2B), n, C);
    const ProductIn ln2f = gather_input(ctx, ln2, sz(n, C), sz(N, C));
    ops.linear_forward(fch.out(), ln2f.operand(), W(FCW), P(FCB), nullptr, N, C, Fl);
    ops.gelu_forward(fch_gelu.out(), fch.operand(), sz(N, Fl));
    float* part2 = ctx.scratch->f32(sz(N, C));
    ops.linear_forward(part2, fch_gelu.operand(), W(FCPROJW), lead ? P(FCPROJB) : nullptr,
                       nullptr, N, Fl, C);
    ctx.tensor->scatter(y, part2, sz(n, C));
    ops.residual_forward(y, y, x2, sz(n, C));
  }

  ActivationDecl declare_activations(int, BatchShape shape) const override {
    const Dims d = dims(shape, s_.size);
    const size_t B = size_t(d.B), T = size_t(d.T), N = size_t(d.N), n = size_t(d.n),
                 C = size_t(c_.d_model), Hl = size_t(c_.n_head / d.t), hd = C / size_t(c_.n_head),
                 Cl = Hl * hd, Fl = size_t(c_.d_ff / d.t);
    const size_t kept[] = {n, n, B * Hl * T, n * C, n, n};
    const size_t inputs[] = {n * C, N * 3 * Cl, N * Cl, n * C, N * Fl, N * Fl};
    ActivationDecl a;
    for (size_t v : kept) a.saved += f32b(v), a.scratch_eval += scrb(v);
    for (size_t v : inputs) {
      a.saved += shape.input_bytes(v);
      a.scratch_eval += shape.input_scratch(v);
    }
    a.saved_cheap = shape.input_bytes(n * C) * 2 + shape.input_bytes(N * Fl);
    // gathered ln1, [qkv's fp32 product], partial, gathered ln2, partial2
    const size_t fwd = shape.input_scratch(N * C) + (shape.lowp() ? scrb(N * 3 * Cl) : 0) +
                       scrb(N * C) + shape.input_scratch(N * C) + scrb(N * C);
    a.scratch_fwd = fwd;
    a.scratch_eval += fwd;
    a.scratch_logits = a.scratch_eval;
    a.scratch_recompute = 2 * scrb(n);
    // dy gathered, dfch_gelu, dfch, ln2 gathered, dln2 partial, dln2, dx2 gathered, datty,
    // dqkv, ln1 gathered, dln1 partial, dln1
    a.scratch_bwd = scrb(N * C) + 2 * shape.input_scratch(N * Fl) + shape.input_scratch(N * C) +
                    scrb(N * C) + scrb(n * C) + scrb(N * C) + shape.input_scratch(N * Cl) +
                    shape.input_scratch(N * 3 * Cl) + shape.input_scratch(N * C) + scrb(N * C) +
                    scrb(n * C);
    return a;
  }

  std::vector<TensorColl> declare_tensor_comm(int, Pass pass, BatchShape shape) const override {
    return block_comm(c_, pass, shape, s_.size);
  }

  bool selective_recompute() const override { return true; }
  void recompute_cheap(UnitCtx& ctx, int, const float* x) override {
    using namespace gpt2;
    const Ops& ops = *ctx.ops;
    const Dims d = dims(ctx);
    const int C = c_.d_model, Fl = c_.d_ff / d.t, n = d.n;
    ScratchScope guard{ctx.scratch};
    Saved& s = *ctx.saved;
    float* mean = ctx.scratch->f32(sz(n));
    float* rstd = ctx.scratch->f32(sz(n));
    ops.layernorm_forward(saved_input(s, kLn1, sz(n, C), ops).out(), mean, rstd, x,
                          ctx.param(LN1W), ctx.param(LN1B), n, C);
    ops.layernorm_forward(saved_input(s, kLn2, sz(n, C), ops).out(), mean, rstd, s.get(kX2),
                          ctx.param(LN2W), ctx.param(LN2B), n, C);
    ops.gelu_forward(saved_input(s, kFchGelu, sz(d.N, Fl), ops).out(),
                     saved_input(s, kFch, ops).operand(), sz(d.N, Fl));
  }

  bool backward_in_place() const override { return true; }

  void backward(UnitCtx& ctx, int, const float* x, const float* dy, float* dx) override {
    using namespace gpt2;
    const Ops& ops = *ctx.ops;
    const Dims d = dims(ctx);
    const int C = c_.d_model, Hl = c_.n_head / d.t, hd = C / c_.n_head, Cl = Hl * hd,
              Fl = c_.d_ff / d.t, N = d.N, n = d.n;
    ScratchScope guard{ctx.scratch};
    auto P = [&](size_t i) { return ctx.param(i); };
    auto W = [&](size_t i) { return ctx.weight(i); };
    auto G = [&](size_t i) { return ctx.grad(i); };
    auto GO = [&](size_t i) { return ctx.grad_out(i); };
    const bool lead = d.k == 0;
    const Saved& s = *ctx.saved;

    // dy is read here only, so dx may be dy.
    const float* dyf = gather_f32(ctx, dy, sz(n, C), sz(N, C));
    if (dx != dy) ops.copy(dx, dy, sz(n, C));
    const ProductIn dfch_gelu = scratch_input(*ctx.scratch, sz(N, Fl), ops);
    ops.linear_backward(dfch_gelu.set(), GO(FCPROJW), lead ? GO(FCPROJB) : GradOut(nullptr), dyf,
                        saved_input(s, kFchGelu, ops).operand(), W(FCPROJW), N, Fl, C);
    const ProductIn dfch = scratch_input(*ctx.scratch, sz(N, Fl), ops);
    ops.gelu_backward(dfch.set(), saved_input(s, kFch, ops).operand(), dfch_gelu.operand(),
                      sz(N, Fl));
    const ProductIn ln2f = gather_input(ctx, saved_input(s, kLn2, ops), sz(n, C), sz(N, C));
    float* dln2p = ctx.scratch->f32(sz(N, C));
    ops.linear_backward(GradIn::set(dln2p), GO(FCW), GO(FCB), dfch.operand(), ln2f.operand(),
                        W(FCW), N, C, Fl);
    float* dln2 = ctx.scratch->f32(sz(n, C));
    ctx.tensor->scatter(dln2, dln2p, sz(n, C));
    layernorm_backward_resid(ctx, dx, G(LN2W), G(LN2B), dln2, s.get(kX2), P(LN2W),
                             s.get(kLn2Mean), s.get(kLn2Rstd), n, C);
    // dx holds dL/dx2 (this rank's rows)
    const float* dx2f = gather_f32(ctx, dx, sz(n, C), sz(N, C));
    const ProductIn qkv = saved_input(s, kQkv, ops), atty = saved_input(s, kAtty, ops);
    const ProductIn datty = scratch_input(*ctx.scratch, sz(N, Cl), ops);
    ops.linear_backward(datty.set(), GO(PROJW), lead ? GO(PROJB) : GradOut(nullptr), dx2f,
                        atty.operand(), W(PROJW), N, Cl, C);
    const ProductIn dqkv = scratch_input(*ctx.scratch, sz(N, 3 * Cl), ops);
    ops.attention_backward(dqkv.set(), datty.operand(), qkv.operand(), atty.operand(),
                           s.get(kLse), d.B, d.T, Hl, Hl, hd);
    const ProductIn ln1f = gather_input(ctx, saved_input(s, kLn1, ops), sz(n, C), sz(N, C));
    float* dln1p = ctx.scratch->f32(sz(N, C));
    ops.linear_backward(GradIn::set(dln1p), GO(QKVW), GO(QKVB), dqkv.operand(), ln1f.operand(),
                        W(QKVW), N, C, 3 * Cl);
    float* dln1 = ctx.scratch->f32(sz(n, C));
    ctx.tensor->scatter(dln1, dln1p, sz(n, C));
    layernorm_backward_resid(ctx, dx, G(LN1W), G(LN1B), dln1, x, P(LN1W), s.get(kLn1Mean),
                             s.get(kLn1Rstd), n, C);
  }

 private:
  ModelConfig c_;
  int layer_;
  TensorSlice s_;
};

// ---- Llama ------------------------------------------------------------------------------------

// The embedding ("embed", untied), the head ("head": norm.weight, lm_head.weight) or both
// ("embed_head", tied: embed_tokens.weight is the head's weight; calls 0 and 1).
class LlamaVocab final : public Unit {
 public:
  enum class Role : uint8_t { Embed, Head, EmbedHead };
  LlamaVocab(const ModelConfig& c, TensorSlice s, Role r) : c_(c), s_(s), r_(r) {}
  std::string name() const override {
    return r_ == Role::Embed ? "embed" : r_ == Role::Head ? "head" : "embed_head";
  }
  int num_calls() const override { return r_ == Role::EmbedHead ? 2 : 1; }
  std::vector<ParamSpec> params() const override {
    const int64_t V = c_.vocab_size, C = c_.d_model, Vl = V / s_.size, lo = Vl * s_.rank;
    const ParamSpec table = rows(product_weight(spec("embed_tokens.weight", {V, C}, Init::Normal,
                                                     0.02f, "model.embed_tokens.weight")),
                                 {{lo, lo + Vl}});
    const ParamSpec norm = spec("norm.weight", {C}, Init::Ones, 0.f, "model.norm.weight");
    switch (r_) {
      case Role::Embed: return {table};
      case Role::EmbedHead: return {table, norm};
      case Role::Head:
        return {norm, rows(product_weight(spec("lm_head.weight", {V, C}, Init::Normal, 0.02f,
                                               "lm_head.weight")),
                           {{lo, lo + Vl}})};
    }
    return {};
  }
  void forward(UnitCtx& ctx, int call, const float* x, float* y) override {
    if (embeds(call)) return embed_forward(ctx, c_, 0, -1, y);
    head_forward(ctx, c_, hp(), x);
  }
  void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) override {
    if (embeds(call)) return embed_backward(ctx, c_, 0, -1, dy);
    head_backward(ctx, c_, hp(), x, dx);
  }
  ActivationDecl declare_activations(int call, BatchShape s) const override {
    return embeds(call) ? embed_decl(c_, s, s_.size) : head_decl(c_, s, s_.size, false);
  }
  std::vector<TensorColl> declare_tensor_comm(int call, Pass pass, BatchShape s) const override {
    return embeds(call) ? embed_comm(c_, pass, s, s_.size) : head_comm(c_, pass, s, s_.size);
  }

 private:
  bool embeds(int call) const {
    return r_ == Role::Embed || (r_ == Role::EmbedHead && call == 0);
  }
  HeadParams hp() const {
    return r_ == Role::Head ? HeadParams{1, 0, -1} : HeadParams{0, 1, -1};
  }
  ModelConfig c_;
  TensorSlice s_;
  Role r_;
};


namespace llama = units::llama_block;

// A Llama block: q heads split; KV heads split where t divides them, else (t a multiple of
// KVH) every rank holds all of them, replicated, and uses the one its q heads read (its
// gradient rows come from the ranks sharing that head, the others' stay zero, and the tensor
// group's sum of replicated gradients adds them up).
class LlamaBlock final : public Unit {
 public:
  LlamaBlock(const ModelConfig& c, int layer, TensorSlice s)
      : c_(c), layer_(layer), s_(s), rope_(rope_spec(c)),
        kv_split_(c.n_kv_head % s.size == 0) {
    size_t i = 0;
    in_ = i++, post_ = i++;
    if (!kv_split_) {
      kw_ = i++, vw_ = i++;
      if (c_.qkv_bias) kb_ = i++, vb_ = i++;
    }
    qw_ = i++;
    if (kv_split_) kw_ = i++, vw_ = i++;
    ow_ = i++, gate_ = i++, up_ = i++, down_ = i++;
    if (c_.qkv_bias) {
      qb_ = i++;
      if (kv_split_) kb_ = i++, vb_ = i++;
    }
    count_ = i;
  }
  std::string name() const override { return "layers." + std::to_string(layer_); }

  std::vector<ParamSpec> params() const override {
    const int64_t C = c_.d_model, H = c_.n_head, KVH = c_.n_kv_head, hd = C / H, F = c_.d_ff;
    const int64_t t = s_.size, k = s_.rank, Hl = H / t, Fl = F / t;
    const std::string n = name() + ".", hf = "model." + n;
    const float res_std = 0.02f / std::sqrt(2.f * static_cast<float>(c_.n_layer));
    std::vector<ParamSpec> p(count_);
    p[in_] = spec(n + "input_layernorm.weight", {C}, Init::Ones, 0.f, hf + "input_layernorm.weight");
    p[post_] = spec(n + "post_attention_layernorm.weight", {C}, Init::Ones, 0.f,
                    hf + "post_attention_layernorm.weight");
    auto proj = [&](const char* w, int64_t oc, float sd) {
      return linear_weight(spec(n + "self_attn." + w + ".weight", {oc, C}, Init::Normal, sd,
                                 hf + "self_attn." + w + ".weight"));
    };
    p[qw_] = rows(proj("q_proj", H * hd, 0.02f), {{k * Hl * hd, (k + 1) * Hl * hd}});
    const int64_t KVl = KVH / t;
    p[kw_] = proj("k_proj", KVH * hd, 0.02f);
    p[vw_] = proj("v_proj", KVH * hd, 0.02f);
    if (kv_split_) {
      p[kw_] = rows(p[kw_], {{k * KVl * hd, (k + 1) * KVl * hd}});
      p[vw_] = rows(p[vw_], {{k * KVl * hd, (k + 1) * KVl * hd}});
    }
    p[ow_] = cols(linear_weight(spec(n + "self_attn.o_proj.weight", {C, H * hd}, Init::Normal,
                                      res_std, hf + "self_attn.o_proj.weight")),
                  k * Hl * hd, (k + 1) * Hl * hd);
    p[gate_] = rows(linear_weight(spec(n + "mlp.gate_proj.weight", {F, C}, Init::Normal, 0.02f,
                                        hf + "mlp.gate_proj.weight")),
                    {{k * Fl, (k + 1) * Fl}});
    p[up_] = rows(linear_weight(spec(n + "mlp.up_proj.weight", {F, C}, Init::Normal, 0.02f,
                                      hf + "mlp.up_proj.weight")),
                  {{k * Fl, (k + 1) * Fl}});
    p[down_] = cols(linear_weight(spec(n + "mlp.down_proj.weight", {C, F}, Init::Normal, res_std,
                                        hf + "mlp.down_proj.weight")),
                    k * Fl, (k + 1) * Fl);
    if (c_.qkv_bias) {
      auto bias = [&](const char* w, int64_t oc) {
        const std::string b = std::string("self_attn.") + w + ".bias";
        return spec(n + b, {oc}, Init::Zeros, 0.f, hf + b);
      };
      p[qb_] = rows(bias("q_proj", H * hd), {{k * Hl * hd, (k + 1) * Hl * hd}});
      p[kb_] = bias("k_proj", KVH * hd);
      p[vb_] = bias("v_proj", KVH * hd);
      if (kv_split_) {
        p[kb_] = rows(p[kb_], {{k * KVl * hd, (k + 1) * KVl * hd}});
        p[vb_] = rows(p[vb_], {{k * KVl * hd, (k + 1) * KVl * hd}});
      }
    }
    return p;
  }

  void forward(UnitCtx& ctx, int, const float* x, float* y) override {
    using namespace llama;
    const Ops& ops = *ctx.ops;
    const Dims d = dims(ctx);
    const Sizes z = sizes(d.t);
    const int C = c_.d_model, N = d.N, n = d.n;
    const float eps = c_.norm_eps;
    ScratchScope guard{ctx.scratch};
    const ProductIn xn = keep_input(ctx, kXn, sz(n, C));
    float* rstd1 = keep(ctx, kRstd1, sz(n));
    const ProductIn qkv = keep_input(ctx, kQkv, sz(N, z.qkv));
    const ProductIn atty = keep_input(ctx, kAtty, sz(N, z.q));
    float* lse = keep(ctx, kLse, sz(d.B, int64_t{z.Hl} * d.T));
    float* x2 = keep(ctx, kX2, sz(n, C));
    const ProductIn xn2 = keep_input(ctx, kXn2, sz(n, C));
    float* rstd2 = keep(ctx, kRstd2, sz(n));
    const ProductIn gu = keep_input(ctx, kGu, sz(N, 2 * z.Fl));
    const ProductIn hmlp = keep_input(ctx, kHmlp, sz(N, z.Fl));

    ops.rmsnorm_forward(xn.out(), rstd1, x, ctx.param(in_), n, C, eps);
    const ProductIn xnf = gather_input(ctx, xn, sz(n, C), sz(N, C));
    packed_forward_to(ops, qkv, xnf.operand(), qkv_pack(ctx, d), N, C);
    ops.rope_forward(qkv.out(), qkv.operand(), d.B, d.T, z.Hl, z.KVl, z.hd, rope_);
    ops.attention_forward(atty.out(), lse, qkv.operand(), d.B, d.T, z.Hl, z.KVl, z.hd);
    float* part = ctx.scratch->f32(sz(N, C));
    ops.linear_forward(part, atty.operand(), ctx.weight(ow_), nullptr, nullptr, N, z.q, C);
    ctx.tensor->scatter(x2, part, sz(n, C));
    ops.residual_forward(x2, x2, x, sz(n, C));
    ops.rmsnorm_forward(xn2.out(), rstd2, x2, ctx.param(post_), n, C, eps);
    const ProductIn xn2f = gather_input(ctx, xn2, sz(n, C), sz(N, C));
    packed_forward_to(ops, gu, xn2f.operand(), gu_pack(ctx), N, C);
    ops.swiglu_forward(hmlp.out(), gu.operand(), N, z.Fl);
    float* part2 = ctx.scratch->f32(sz(N, C));
    ops.linear_forward(part2, hmlp.operand(), ctx.weight(down_), nullptr, nullptr, N, z.Fl, C);
    ctx.tensor->scatter(y, part2, sz(n, C));
    ops.residual_forward(y, y, x2, sz(n, C));
  }

  ActivationDecl declare_activations(int, BatchShape shape) const override {
    const Dims d = dims(shape, s_.size);
    const Sizes z = sizes(d.t);
    const size_t B = size_t(d.B), T = size_t(d.T), N = size_t(d.N), n = size_t(d.n),
                 C = size_t(c_.d_model), Hl = size_t(z.Hl), q = size_t(z.q),
                 qkv = size_t(z.qkv), Fl = size_t(z.Fl);
    const size_t kept[] = {n, B * Hl * T, n * C, n};  // rstd1, lse, x2, rstd2
    const size_t inputs[] = {n * C, N * qkv, N * q, n * C, N * 2 * Fl, N * Fl};
    ActivationDecl a;
    for (size_t v : kept) a.saved += f32b(v), a.scratch_eval += scrb(v);
    for (size_t v : inputs) {
      a.saved += shape.input_bytes(v);
      a.scratch_eval += shape.input_scratch(v);
    }
    a.saved_cheap = shape.input_bytes(n * C) * 2 + shape.input_bytes(N * Fl);
    // gathered xn, partial, gathered xn2, partial2
    const size_t fwd = 2 * shape.input_scratch(N * C) + 2 * scrb(N * C);
    a.scratch_fwd = fwd;
    a.scratch_eval += fwd;
    a.scratch_logits = a.scratch_eval;
    a.scratch_recompute = scrb(n);
    // dy gathered, dh, dgu, xn2 gathered, dxn2 partial, dxn2, dx2 gathered, datty, dqkv,
    // xn gathered, dxn partial, dxn
    a.scratch_bwd = scrb(N * C) + shape.input_scratch(N * Fl) + shape.input_scratch(N * 2 * Fl) +
                    shape.input_scratch(N * C) + scrb(N * C) + scrb(n * C) + scrb(N * C) +
                    shape.input_scratch(N * q) + shape.input_scratch(N * qkv) +
                    shape.input_scratch(N * C) + scrb(N * C) + scrb(n * C);
    return a;
  }

  std::vector<TensorColl> declare_tensor_comm(int, Pass pass, BatchShape shape) const override {
    return block_comm(c_, pass, shape, s_.size);
  }

  bool selective_recompute() const override { return true; }
  void recompute_cheap(UnitCtx& ctx, int, const float* x) override {
    using namespace llama;
    const Ops& ops = *ctx.ops;
    const Dims d = dims(ctx);
    const Sizes z = sizes(d.t);
    const int C = c_.d_model, n = d.n;
    const float eps = c_.norm_eps;
    ScratchScope guard{ctx.scratch};
    Saved& s = *ctx.saved;
    float* rstd = ctx.scratch->f32(sz(n));
    ops.rmsnorm_forward(saved_input(s, kXn, sz(n, C), ops).out(), rstd, x, ctx.param(in_), n, C,
                        eps);
    ops.rmsnorm_forward(saved_input(s, kXn2, sz(n, C), ops).out(), rstd, s.get(kX2),
                        ctx.param(post_), n, C, eps);
    ops.swiglu_forward(saved_input(s, kHmlp, sz(d.N, z.Fl), ops).out(),
                       saved_input(s, kGu, ops).operand(), d.N, z.Fl);
  }

  bool backward_in_place() const override { return true; }

  void backward(UnitCtx& ctx, int, const float* x, const float* dy, float* dx) override {
    using namespace llama;
    const Ops& ops = *ctx.ops;
    const Dims d = dims(ctx);
    const Sizes z = sizes(d.t);
    const int C = c_.d_model, N = d.N, n = d.n;
    ScratchScope guard{ctx.scratch};
    const Saved& s = *ctx.saved;
    const float* dyf = gather_f32(ctx, dy, sz(n, C), sz(N, C));
    if (dx != dy) ops.copy(dx, dy, sz(n, C));
    const ProductIn dh = scratch_input(*ctx.scratch, sz(N, z.Fl), ops);
    ops.linear_backward(dh.set(), ctx.grad_out(down_), nullptr, dyf,
                        saved_input(s, kHmlp, ops).operand(), ctx.weight(down_), N, z.Fl, C);
    const ProductIn dgu = scratch_input(*ctx.scratch, sz(N, 2 * z.Fl), ops);
    ops.swiglu_backward(dgu.set(), dh.operand(), saved_input(s, kGu, ops).operand(), N, z.Fl);
    const ProductIn xn2f = gather_input(ctx, saved_input(s, kXn2, ops), sz(n, C), sz(N, C));
    float* dxn2p = ctx.scratch->f32(sz(N, C));
    packed_backward_set(ops, dxn2p, dgu.operand(), xn2f.operand(), gu_pack(ctx, true), N, C);
    float* dxn2 = ctx.scratch->f32(sz(n, C));
    ctx.tensor->scatter(dxn2, dxn2p, sz(n, C));
    rmsnorm_backward_resid(ctx, dx, ctx.grad(post_), dxn2, s.get(kX2), ctx.param(post_),
                           s.get(kRstd2), n, C);
    const float* dx2f = gather_f32(ctx, dx, sz(n, C), sz(N, C));
    const ProductIn atty = saved_input(s, kAtty, ops), qkv = saved_input(s, kQkv, ops);
    const ProductIn datty = scratch_input(*ctx.scratch, sz(N, z.q), ops);
    ops.linear_backward(datty.set(), ctx.grad_out(ow_), nullptr, dx2f, atty.operand(),
                        ctx.weight(ow_), N, z.q, C);
    const ProductIn dqkv = scratch_input(*ctx.scratch, sz(N, z.qkv), ops);
    ops.attention_backward(dqkv.set(), datty.operand(), qkv.operand(), atty.operand(),
                           s.get(kLse), d.B, d.T, z.Hl, z.KVl, z.hd);
    ops.rope_backward(dqkv.out(), dqkv.operand(), d.B, d.T, z.Hl, z.KVl, z.hd, rope_);
    const ProductIn xnf = gather_input(ctx, saved_input(s, kXn, ops), sz(n, C), sz(N, C));
    float* dxnp = ctx.scratch->f32(sz(N, C));
    packed_backward_set(ops, dxnp, dqkv.operand(), xnf.operand(), qkv_pack(ctx, d, true), N, C);
    float* dxn = ctx.scratch->f32(sz(n, C));
    ctx.tensor->scatter(dxn, dxnp, sz(n, C));
    rmsnorm_backward_resid(ctx, dx, ctx.grad(in_), dxn, x, ctx.param(in_), s.get(kRstd1), n, C);
  }

 private:
  struct Sizes {
    int Hl, KVl, hd, q, qkv, Fl;
  };
  Sizes sizes(int t) const {
    const int hd = c_.d_model / c_.n_head, Hl = c_.n_head / t;
    const int KVl = kv_split_ ? c_.n_kv_head / t : 1;
    return {Hl, KVl, hd, Hl * hd, (Hl + 2 * KVl) * hd, c_.d_ff / t};
  }
  // The KV head this rank's q heads read, when the KV heads are replicated (0 when split).
  int kv_head(const Dims& d) const { return kv_split_ ? 0 : d.k / (d.t / c_.n_kv_head); }
  Packed qkv_pack(UnitCtx& ctx, const Dims& d, bool grads = false) const {
    const Sizes z = sizes(d.t);
    const size_t C = size_t(c_.d_model);
    const size_t off = size_t(kv_head(d)) * size_t(z.hd);  // rows of a replicated K / V
    Packed p;
    p.n = 3;
    const size_t idx[3] = {qw_, kw_, vw_}, bidx[3] = {qb_, kb_, vb_};
    const int oc[3] = {z.q, z.KVl * z.hd, z.KVl * z.hd};
    for (int i = 0; i < 3; ++i) {
      const bool rep = i > 0 && !kv_split_;
      p.w[i] = ctx.weight(idx[i]).at(rep ? off * C : 0);
      // (a replicated K / V: only this rank's head's rows get gradients, added into the
      // zeroed buffer; a split one: written where unwritten)
      if (grads) p.dw[i] = rep ? GradOut(ctx.grad(idx[i]) + off * C) : ctx.grad_out(idx[i]);
      p.oc[i] = oc[i];
      if (!c_.qkv_bias) continue;
      p.b[i] = ctx.param(bidx[i]) + (rep ? off : 0);
      if (grads) p.db[i] = rep ? GradOut(ctx.grad(bidx[i]) + off) : ctx.grad_out(bidx[i]);
    }
    return p;
  }
  Packed gu_pack(UnitCtx& ctx, bool grads = false) const {
    Packed p;
    p.n = 2;
    const size_t idx[2] = {gate_, up_};
    for (int i = 0; i < 2; ++i) {
      p.w[i] = ctx.weight(idx[i]);
      if (grads) p.dw[i] = ctx.grad_out(idx[i]);
      p.oc[i] = c_.d_ff / s_.size;
    }
    return p;
  }
  ModelConfig c_;
  int layer_;
  TensorSlice s_;
  RopeSpec rope_;
  bool kv_split_;
  size_t in_ = 0, post_ = 0, qw_ = 0, kw_ = 0, vw_ = 0, ow_ = 0, gate_ = 0, up_ = 0, down_ = 0,
         qb_ = 0, kb_ = 0, vb_ = 0, count_ = 0;
};

}  // namespace

void build_gpt2_tensor(Model& m) {
  const ModelConfig& c = m.config;
  m.units.push_back(std::make_unique<Gpt2EmbedHead>(c, m.tensor));
  for (int l = 0; l < c.n_layer; ++l)
    m.units.push_back(std::make_unique<Gpt2Block>(c, l, m.tensor));
  m.schedule.push_back({0, 0});
  for (int l = 0; l < c.n_layer; ++l) m.schedule.push_back({l + 1, 0});
  m.schedule.push_back({0, 1});
}

void build_llama_tensor(Model& m) {
  const ModelConfig& c = m.config;
  if (c.tied())
    m.units.push_back(std::make_unique<LlamaVocab>(c, m.tensor, LlamaVocab::Role::EmbedHead));
  else
    m.units.push_back(std::make_unique<LlamaVocab>(c, m.tensor, LlamaVocab::Role::Embed));
  for (int l = 0; l < c.n_layer; ++l)
    m.units.push_back(std::make_unique<LlamaBlock>(c, l, m.tensor));
  if (!c.tied())
    m.units.push_back(std::make_unique<LlamaVocab>(c, m.tensor, LlamaVocab::Role::Head));
  for (int u = 0; u < static_cast<int>(m.units.size()); ++u) m.schedule.push_back({u, 0});
  if (c.tied()) m.schedule.push_back({0, 1});
}

}  // namespace sw
