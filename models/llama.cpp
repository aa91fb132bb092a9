// Llama-style units (see llama.h). Shapes: B batch, T time, N = B*T rows, C d_model,
// H query heads, KVH key/value heads, hd = C/H, QKV = (H + 2*KVH)*hd, F = d_ff, V vocab.
#include "models/llama.h"

#include <cmath>

#include "core/error.h"
#include "models/packed.h"
#include "models/unit_helpers.h"

namespace sw {

namespace {

using namespace units;

// What the units keep from forward for backward: the slots of their Saved. Keep::Cheap marks
// what selective checkpointing drops and Block::recompute_cheap rebuilds.
namespace kept {
using namespace units::llama_block;  // a block's
// the head's loss call
constexpr SavedSlot<float> kHnorm{0, Keep::Always, "hnorm"}, kRstd{1, Keep::Always, "rstd"},
    kDhnorm{2, Keep::Always, "dhnorm"};
constexpr SavedFlag kFused{0, "fused"};  // the LM head's gradients came with forward
}  // namespace kept



ParamSpec spec(std::string name, Shape shape, Init init, float std, std::string hf) {
  return param_spec(std::move(name), std::move(shape), init, std, std::move(hf));
}

// ---- [0] embed -------------------------------------------------------------------------------
// y = table[tokens], table (V,C) the unit's parameter p (Embed's, or a tied Head's call 0).
void embed_forward(UnitCtx& ctx, const ModelConfig& c, size_t p, float* y) {
  const Batch& b = *ctx.batch;
  if (b.T > c.seq_len)
    fail("model", "batch sequence length " + std::to_string(b.T) + " exceeds model.seq_len = " +
                      std::to_string(c.seq_len));
  ctx.ops->embedding_forward(y, b.tokens, ctx.weight(p), nullptr, b.B, b.T, c.d_model,
                             c.vocab_size);
}
void embed_backward(UnitCtx& ctx, const ModelConfig& c, size_t p, const float* dy) {
  const Batch& b = *ctx.batch;
  ctx.ops->embedding_backward(ctx.grad(p), nullptr, dy, b.tokens, b.B, b.T, c.d_model);
}

class Embed final : public Unit {
 public:
  explicit Embed(const ModelConfig& c) : c_(c) {}
  std::string name() const override { return "embed"; }
  std::vector<ParamSpec> params() const override {
    // (V,C), read through its 16-bit copy where the unit keeps one (embedding_forward)
    return {product_weight(spec("embed_tokens.weight", {c_.vocab_size, c_.d_model},
                                Init::Normal, 0.02f, "model.embed_tokens.weight"))};
  }
  void forward(UnitCtx& ctx, int call, const float* x, float* y) override {
    embed_forward(ctx, c_, 0, y);
  }
  ActivationDecl declare_activations(int, BatchShape) const override { return {}; }  // none
  void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) override {
    embed_backward(ctx, c_, 0, dy);
  }

 private:
  ModelConfig c_;
};

// ---- [1..L] blocks ---------------------------------------------------------------------------
class Block final : public Unit {
 public:
  Block(const ModelConfig& c, int layer) : c_(c), layer_(layer), rope_(rope_spec(c)) {}
  std::string name() const override { return "layers." + std::to_string(layer_); }

  // QB, KB, VB: with qkv_bias only (after the others, so the indices above stay).
  enum : size_t { IN_NORM, QW, KW, VW, OW, POST_NORM, GATEW, UPW, DOWNW, QB, KB, VB };

  std::vector<ParamSpec> params() const override {
    const int64_t C = c_.d_model, H = c_.n_head, KVH = c_.n_kv_head, hd = C / H, F = c_.d_ff;
    const std::string n = name() + ".", hf = "model." + n;
    const float res_std = 0.02f / std::sqrt(2.f * static_cast<float>(c_.n_layer));
    std::vector<ParamSpec> p = {
        spec(n + "input_layernorm.weight", {C}, Init::Ones, 0.f, hf + "input_layernorm.weight"),
        linear_weight(spec(n + "self_attn.q_proj.weight", {H * hd, C}, Init::Normal, 0.02f, hf + "self_attn.q_proj.weight")),
        linear_weight(spec(n + "self_attn.k_proj.weight", {KVH * hd, C}, Init::Normal, 0.02f, hf + "self_attn.k_proj.weight"), true),
        linear_weight(spec(n + "self_attn.v_proj.weight", {KVH * hd, C}, Init::Normal, 0.02f, hf + "self_attn.v_proj.weight"), true),
        linear_weight(spec(n + "self_attn.o_proj.weight", {C, H * hd}, Init::Normal, res_std, hf + "self_attn.o_proj.weight")),
        spec(n + "post_attention_layernorm.weight", {C}, Init::Ones, 0.f, hf + "post_attention_layernorm.weight"),
        linear_weight(spec(n + "mlp.gate_proj.weight", {F, C}, Init::Normal, 0.02f, hf + "mlp.gate_proj.weight")),
        linear_weight(spec(n + "mlp.up_proj.weight", {F, C}, Init::Normal, 0.02f, hf + "mlp.up_proj.weight"), true),
        linear_weight(spec(n + "mlp.down_proj.weight", {C, F}, Init::Normal, res_std, hf + "mlp.down_proj.weight")),
    };
    if (c_.qkv_bias) {  // (H*hd), (KVH*hd), (KVH*hd): zeros, no weight decay
      const int64_t oc[3] = {H * hd, KVH * hd, KVH * hd};
      const char* w[3] = {"q_proj", "k_proj", "v_proj"};
      for (int i = 0; i < 3; ++i) {
        const std::string b = std::string("self_attn.") + w[i] + ".bias";
        p.push_back(spec(n + b, {oc[i]}, Init::Zeros, 0.f, hf + b));
      }
    }
    return p;
  }

  void forward(UnitCtx& ctx, int call, const float* x, float* y) override {
    const Ops& ops = *ctx.ops;
    const int B = ctx.batch->B, T = ctx.batch->T, C = c_.d_model, H = c_.n_head,
              KVH = c_.n_kv_head, F = c_.d_ff;
    const int N = B * T, hd = C / H, QKV = (H + 2 * KVH) * hd;
    const float eps = c_.norm_eps;
    ScratchScope guard{ctx.scratch};
    auto P = [&](size_t i) { return ctx.param(i); };

    // xn, xn2 and hmlp are the products' inputs, gu a product's output that only the SwiGLU
    // reads: 16-bit with 16-bit products (ProductIn; gu as PyTorch's autocast keeps it).
    const ProductIn xn = keep_input(ctx, kept::kXn, sz(N, C));  // (N,C) input_layernorm(x)
    float* rstd1 = keep(ctx, kept::kRstd1, sz(N));        // (N)
    // (N,QKV) [q | k | v], q and k rotated; (N,H*hd) attention's output: the products' and
    // attention's operands, 16-bit with 16-bit products.
    const ProductIn qkv = keep_input(ctx, kept::kQkv, sz(N, QKV));
    const ProductIn atty = keep_input(ctx, kept::kAtty, sz(N, int64_t{H} * hd));
    float* lse = keep(ctx, kept::kLse, sz(B, int64_t{H} * T));     // (B,H,T)
    float* x2 = keep(ctx, kept::kX2, sz(N, C));           // (N,C) residual after attention
    // (N,C) post_attention_layernorm(x2)
    const ProductIn xn2 = keep_input(ctx, kept::kXn2, sz(N, C));
    float* rstd2 = keep(ctx, kept::kRstd2, sz(N));        // (N)
    const ProductIn gu = keep_input(ctx, kept::kGu, sz(N, 2 * F));  // (N,2F) [gate | up]
    const ProductIn hmlp = keep_input(ctx, kept::kHmlp, sz(N, F));  // (N,F) silu(gate) * up

    ops.rmsnorm_forward(xn.out(), rstd1, x, P(IN_NORM), N, C, eps);
    // qkv: with 16-bit products, written 16-bit by its product (as autocast keeps it) and
    // rotated in place.
    packed_forward_to(ops, qkv, xn.operand(), qkv_pack(ctx), N, C);
    ops.rope_forward(qkv.out(), qkv.operand(), B, T, H, KVH, hd, rope_);
    ops.attention_forward(atty.out(), lse, qkv.operand(), B, T, H, KVH, hd);
    linear_residual_rmsnorm_to(ops, x2, xn2, rstd2, atty.operand(), ctx.weight(OW), nullptr, x,
                               P(POST_NORM), N, H * hd, C, eps);
    packed_forward_to(ops, gu, xn2.operand(), gu_pack(ctx), N, C);
    ops.swiglu_forward(hmlp.out(), gu.operand(), N, F);
    linear_residual_to(ops, y, hmlp.operand(), ctx.weight(DOWNW), nullptr, x2, N, F, C);
  }

  // Forward keeps (in this order) xn, rstd1, qkv, atty, lse, x2, xn2, rstd2, gu, hmlp (xn, qkv,
  // atty, xn2, gu and hmlp 2 bytes a value with 16-bit products, qkv then written 16-bit by
  // its product and rotated in place): in Saved when training, in scratch in inference. recompute_cheap: one (N)
  // statistic in scratch; backward: the six input gradients (written, not zeroed first), dh,
  // dgu, datty and dqkv 16-bit with 16-bit products.
  ActivationDecl declare_activations(int /*call*/, BatchShape shape) const override {
    const size_t B = size_t(shape.B), T = size_t(shape.T), N = B * T, C = size_t(c_.d_model),
                 H = size_t(c_.n_head), KVH = size_t(c_.n_kv_head), hd = C / H,
                 QKV = (H + 2 * KVH) * hd, F = size_t(c_.d_ff);
    const size_t kept[] = {N, B * H * T, N * C, N};  // rstd1, lse, x2, rstd2
    // xn, qkv, atty, xn2, gu, hmlp
    const size_t inputs[] = {N * C, N * QKV, N * H * hd, N * C, N * 2 * F, N * F};
    ActivationDecl d;
    for (size_t n : kept) d.saved += f32b(n), d.scratch_eval += scrb(n);
    for (size_t n : inputs) {
      d.saved += shape.input_bytes(n);
      d.scratch_eval += shape.input_scratch(n);
    }
    d.saved_cheap = shape.input_bytes(N * C) * 2 + shape.input_bytes(N * F);  // xn, xn2, hmlp
    d.scratch_logits = d.scratch_eval;
    d.scratch_recompute = scrb(N);
    // dh, dgu, dxn2, datty, dqkv, dxn (dh, dgu, datty, dqkv ProductIns)
    d.scratch_bwd = shape.input_scratch(N * F) + shape.input_scratch(N * 2 * F) + scrb(N * C) +
                    shape.input_scratch(N * H * hd) + shape.input_scratch(N * QKV) + scrb(N * C);
    return d;
  }

  // Selective: xn, xn2 and hmlp from x, x2 and gu, bit-identical to forward (xn2 is the plain
  // RMSNorm of the saved x2, which forward's fused residual + RMSNorm matches bit for bit; the
  // norm statistics are recomputed into scratch, the saved ones stay).
  bool selective_recompute() const override { return true; }
  void recompute_cheap(UnitCtx& ctx, int /*call*/, const float* x) override {
    const Ops& ops = *ctx.ops;
    const int N = ctx.batch->B * ctx.batch->T, C = c_.d_model, F = c_.d_ff;
    const float eps = c_.norm_eps;
    ScratchScope guard{ctx.scratch};
    Saved& s = *ctx.saved;
    float* rstd = ctx.scratch->f32(sz(N));
    ops.rmsnorm_forward(saved_input(s, kept::kXn, sz(N, C), ops).out(), rstd, x,
                        ctx.param(IN_NORM), N, C, eps);
    ops.rmsnorm_forward(saved_input(s, kept::kXn2, sz(N, C), ops).out(), rstd,
                        s.get(kept::kX2), ctx.param(POST_NORM), N, C, eps);
    ops.swiglu_forward(saved_input(s, kept::kHmlp, sz(N, F), ops).out(),
                       saved_input(s, kept::kGu, ops).operand(), N, F);
  }

  // dy is read by the first product only, before dx is first written (the norm's backward
  // adds into it), so dx may be dy.
  bool backward_in_place() const override { return true; }

  void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) override {
    const Ops& ops = *ctx.ops;
    const int B = ctx.batch->B, T = ctx.batch->T, C = c_.d_model, H = c_.n_head,
              KVH = c_.n_kv_head, F = c_.d_ff;
    const int N = B * T, hd = C / H, QKV = (H + 2 * KVH) * hd;
    ScratchScope guard{ctx.scratch};
    auto P = [&](size_t i) { return ctx.param(i); };
    auto G = [&](size_t i) { return ctx.grad(i); };
    auto GO = [&](size_t i) { return ctx.grad_out(i); };  // a product's weight gradient
    const Saved& s = *ctx.saved;
    // Each input gradient below lands in a fresh scratch region, written (GradIn::set).
    auto fresh = [&](size_t n) { return ctx.scratch->f32(n); };

    // dx starts as dy (the residual path) and collects dL/dx2, then dL/dx.
    if (dx != dy) ops.copy(dx, dy, sz(N, C));
    // MLP: y = x2 + down(swiglu(gate|up(norm2(x2)))). dh, which only the SwiGLU reads, and dgu,
    // which feeds products only: 16-bit with 16-bit products.
    const ProductIn dh = scratch_input(*ctx.scratch, sz(N, F), ops);
    ops.linear_backward(dh.set(), GO(DOWNW), nullptr, dy_operand(ctx, dy),
                        saved_input(s, kept::kHmlp, ops).operand(), ctx.weight(DOWNW), N, F, C);
    const ProductIn dgu = scratch_input(*ctx.scratch, sz(N, 2 * F), ops);
    ops.swiglu_backward(dgu.set(), dh.operand(), saved_input(s, kept::kGu, ops).operand(), N, F);
    float* dxn2 = fresh(sz(N, C));
    packed_backward_set(ops, dxn2, dgu.operand(), saved_input(s, kept::kXn2, ops).operand(),
                        gu_pack(ctx, true), N, C);
    rmsnorm_backward_resid(ctx, dx, G(POST_NORM), dxn2, s.get(kept::kX2), P(POST_NORM),
                           s.get(kept::kRstd2), N, C);
    // Attention: x2 = x + o(attn(rope(qkv(norm1(x))))); dx now holds dL/dx2.
    // datty, which only attention reads, and dqkv, which feeds products only: 16-bit with
    // 16-bit products. Then attention writes dqkv 16-bit (cuDNN's own form; the CPU's fp32
    // values narrowed) and the inverse rotation turns it in place.
    const ProductIn atty = saved_input(s, kept::kAtty, ops), qkv = saved_input(s, kept::kQkv, ops);
    const ProductIn datty = scratch_input(*ctx.scratch, sz(N, int64_t{H} * hd), ops);
    ops.linear_backward(datty.set(), GO(OW), nullptr, dx_operand(ctx, dx), atty.operand(),
                        ctx.weight(OW), N, H * hd, C);
    const ProductIn dqkv = scratch_input(*ctx.scratch, sz(N, QKV), ops);
    ops.attention_backward(dqkv.set(), datty.operand(), qkv.operand(), atty.operand(),
                           s.get(kept::kLse), B, T, H, KVH, hd);
    ops.rope_backward(dqkv.out(), dqkv.operand(), B, T, H, KVH, hd, rope_);
    float* dxn = fresh(sz(N, C));
    packed_backward_set(ops, dxn, dqkv.operand(), saved_input(s, kept::kXn, ops).operand(),
                        qkv_pack(ctx, true), N, C);
    rmsnorm_backward_resid(ctx, dx, G(IN_NORM), dxn, x, P(IN_NORM), s.get(kept::kRstd1), N, C);
  }

 private:
  // The packed products' weights, and with `grads` (backward only: asking marks an unwritten
  // gradient as taken, UnitCtx::grad_out) their gradients.
  Packed qkv_pack(const UnitCtx& ctx, bool grads = false) const {
    const int hd = c_.d_model / c_.n_head;
    Packed p;
    p.n = 3;
    const size_t idx[3] = {QW, KW, VW};
    const int oc[3] = {c_.n_head * hd, c_.n_kv_head * hd, c_.n_kv_head * hd};
    for (int i = 0; i < 3; ++i) {
      p.w[i] = ctx.weight(idx[i]);
      if (grads) p.dw[i] = ctx.grad_out(idx[i]);
      p.oc[i] = oc[i];
      if (!c_.qkv_bias) continue;
      p.b[i] = ctx.param(QB + size_t(i));
      if (grads) p.db[i] = ctx.grad_out(QB + size_t(i));
    }
    return p;
  }
  Packed gu_pack(const UnitCtx& ctx, bool grads = false) const {
    Packed p;
    p.n = 2;
    const size_t idx[2] = {GATEW, UPW};
    for (int i = 0; i < 2; ++i) {
      p.w[i] = ctx.weight(idx[i]);
      if (grads) p.dw[i] = ctx.grad_out(idx[i]);
      p.oc[i] = c_.d_ff;
    }
    return p;
  }
  ModelConfig c_;
  int layer_;
  RopeSpec rope_;
};

// ---- [L+1] head: final norm, LM head, cross-entropy -----------------------------------------
// Untied: "head", unit L+1, one call; 0 norm.weight (C), 1 lm_head.weight (V,C).
// Tied (tie_embeddings, as Llama 3.2 1B): "embed_head", unit 0 in place of "embed", two calls
// (0: the embedding, 1: this head, last in the schedule, as GPT-2's); 0 embed_tokens.weight
// (V,C), which is the LM head's weight (no lm_head.weight in the files), 1 norm.weight (C).
class Head final : public Unit {
 public:
  explicit Head(const ModelConfig& c) : c_(c), tied_(c.tied()) {}
  std::string name() const override { return tied_ ? "embed_head" : "head"; }
  int num_calls() const override { return tied_ ? 2 : 1; }
  std::vector<ParamSpec> params() const override {
    ParamSpec norm = spec("norm.weight", {c_.d_model}, Init::Ones, 0.f, "model.norm.weight");
    if (tied_)
      return {product_weight(spec("embed_tokens.weight", {c_.vocab_size, c_.d_model},
                                  Init::Normal, 0.02f, "model.embed_tokens.weight")),
              norm};
    return {norm, product_weight(spec("lm_head.weight", {c_.vocab_size, c_.d_model},
                                      Init::Normal, 0.02f, "lm_head.weight"))};
  }

  void forward(UnitCtx& ctx, int call, const float* x, float* y) override {
    const Ops& ops = *ctx.ops;
    const Batch& bt = *ctx.batch;
    const int B = bt.B, T = bt.T, C = c_.d_model, V = c_.vocab_size;
    const int N = B * T;
    if (tied_ && call == 0) return embed_forward(ctx, c_, kLm, y);  // the embedding
    ScratchScope guard{ctx.scratch};
    const float* nw = ctx.param(kNorm);  // (C)
    const Operand w = ctx.weight(kLm);  // (V,C), a product's weight
    if (!ctx.training && ctx.logits) {
      // Inference: logits of each sequence's last position only.
      float* xl = ctx.scratch->f32(sz(B, C));  // (B,C)
      for (int b = 0; b < B; ++b) ops.copy(xl + sz(b, C), x + sz(int64_t{b} * T + T - 1, C), sz(C));
      float* hl = ctx.scratch->f32(sz(B, C));
      float* rstd = ctx.scratch->f32(sz(B));
      ops.rmsnorm_forward(hl, rstd, xl, nw, B, C, c_.norm_eps);
      ops.linear_forward(ctx.logits, hl, w, nullptr, nullptr, B, C, V);  // (B,V)
      return;
    }
    SW_CHECK(bt.targets != nullptr, "a loss call needs targets");
    float* h = keep(ctx, kept::kHnorm, sz(N, C));  // (N,C)
    float* rstd = keep(ctx, kept::kRstd, sz(N));   // (N)
    ops.rmsnorm_forward(h, rstd, x, nw, N, C, c_.norm_eps);
    float* losses = ctx.scratch->f32(sz(N));  // (N)
    // Fused: with gradient buffers at hand the LM head's gradients are produced now (see gpt2).
    const bool fused = ctx.training && ctx.grads != nullptr;
    float* dh = nullptr;
    if (fused) {
      dh = ctx.saved->put(kept::kDhnorm, sz(N, C));  // (N,C)
      ops.fill(dh, 0.f, sz(N, C));
    }
    if (ctx.training) ctx.saved->set(kept::kFused, fused);
    add_loss(ctx, losses, dh, fused ? ctx.grad(kLm) : nullptr, h, w, C, V);
  }

  // (A tied unit's call 0, the embedding, allocates nothing.)
  // Training: hnorm, rstd, the fused head's dhnorm saved (the fused flag: a host scalar), the per-row
  // losses in scratch; backward uses no scratch. Inference: everything in scratch.
  ActivationDecl declare_activations(int call, BatchShape shape) const override {
    const size_t B = size_t(shape.B), N = B * size_t(shape.T), C = size_t(c_.d_model);
    ActivationDecl d;
    if (tied_ && call == 0) return d;
    d.saved = f32b(N * C) + f32b(N) + f32b(N * C);  // hnorm, rstd, dhnorm
    d.scratch_fwd = scrb(N);                                  // losses
    d.scratch_eval = scrb(N * C) + scrb(N) + scrb(N);         // hnorm, rstd, losses
    d.scratch_logits = 2 * scrb(B * C) + scrb(B);             // xl, hl, rstd
    return d;
  }

  void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) override {
    const Ops& ops = *ctx.ops;
    const Batch& bt = *ctx.batch;
    const int C = c_.d_model, V = c_.vocab_size, N = bt.B * bt.T;
    if (tied_ && call == 0) return embed_backward(ctx, c_, kLm, dy);
    ScratchScope guard{ctx.scratch};
    const float* h = ctx.saved->get(kept::kHnorm);
    const float* dh;
    if (ctx.saved->flag(kept::kFused)) {
      dh = ctx.saved->get(kept::kDhnorm);
    } else {
      float* d = ctx.scratch->f32(sz(N, C));
      ops.fill(d, 0.f, sz(N, C));
      float* losses = ctx.scratch->f32(sz(N));
      ops.lmhead_xent(losses, d, ctx.grad(kLm), h, ctx.weight(kLm), bt.targets, N, C, V,
                      ctx.grad_scale);
      dh = d;
    }
    ops.fill(dx, 0.f, sz(N, C));
    rmsnorm_backward_resid(ctx, dx, ctx.grad(kNorm), dh, x, ctx.param(kNorm),
                           ctx.saved->get(kept::kRstd), N, C);
  }

 private:
  ModelConfig c_;
  bool tied_;
  const size_t kNorm = tied_ ? 1 : 0, kLm = tied_ ? 0 : 1;  // parameter indices
};

}  // namespace

// RoPE's frequencies as the config gives them (theta, and the llama3 scaling).
RopeSpec rope_spec(const ModelConfig& c) {
  RopeSpec r(c.rope_theta);
  r.llama3 = c.rope_scaling == "llama3";
  r.factor = c.rope_factor;
  r.low_freq_factor = c.rope_low_freq_factor;
  r.high_freq_factor = c.rope_high_freq_factor;
  r.original_max_pos = c.rope_original_max_pos;
  return r;
}

void build_llama(Model& m) {
  const ModelConfig& c = m.config;
  if (c.tied())
    m.units.push_back(std::make_unique<Head>(c));  // "embed_head"
  else
    m.units.push_back(std::make_unique<Embed>(c));
  for (int l = 0; l < c.n_layer; ++l) m.units.push_back(std::make_unique<Block>(c, l));
  if (!c.tied()) m.units.push_back(std::make_unique<Head>(c));
  for (int u = 0; u < static_cast<int>(m.units.size()); ++u) m.schedule.push_back({u, 0});
  if (c.tied()) m.schedule.push_back({0, 1});
}

}  // namespace sw
