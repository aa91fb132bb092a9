// GPT-2 units (see gpt2.h). Shapes: B batch, T time, N = B*T rows, C d_model, H heads,
// hd = C/H, F = d_ff (4C), V vocab, maxT = seq_len.
#include "models/gpt2.h"

#include <cmath>

#include "core/error.h"
#include "models/unit_helpers.h"

namespace sw {

namespace {

using namespace units;

// What the units keep from forward for backward: the slots of their Saved. Keep::Cheap marks
// what selective checkpointing drops and Block::recompute_cheap rebuilds.
namespace kept {
// embed_head's loss call
constexpr SavedSlot<float> kLnf{0, Keep::Always, "lnf"}, kLnfMean{1, Keep::Always, "lnf_mean"},
    kLnfRstd{2, Keep::Always, "lnf_rstd"}, kDlnf{3, Keep::Always, "dlnf"};
constexpr SavedFlag kFused{0, "fused"};  // the LM head's gradients came with forward
using namespace units::gpt2_block;  // a block's
}  // namespace kept


ParamSpec spec(std::string name, Shape shape, Init init, float std, std::string hf,
               bool hf_t = false) {
  return param_spec(std::move(name), std::move(shape), init, std, std::move(hf), hf_t);
}

// ---- [0] embed_head ------------------------------------------------------------------------
class EmbedHead final : public Unit {
 public:
  explicit EmbedHead(const ModelConfig& c) : c_(c) {}
  std::string name() const override { return "embed_head"; }
  int num_calls() const override { return 2; }

  // 0 wte (V,C); 1 wpe (maxT,C); 2 ln_f.weight (C); 3 ln_f.bias (C); [4 lm_head.weight (V,C)]
  std::vector<ParamSpec> params() const override {
    const int64_t V = c_.vocab_size, C = c_.d_model, maxT = c_.seq_len;
    std::vector<ParamSpec> p = {
        // (the embedding's table and, tied, the LM head's weight: read only through its 16-bit
        // copy where the unit keeps one, the embedding's lookup and the head's products)
        product_weight(spec("wte", {V, C}, Init::Normal, 0.02f, "wte.weight")),
        spec("wpe", {maxT, C}, Init::Normal, 0.02f, "wpe.weight"),
        spec("ln_f.weight", {C}, Init::Ones, 0.f, "ln_f.weight"),
        spec("ln_f.bias", {C}, Init::Zeros, 0.f, "ln_f.bias"),
    };
    if (!c_.tied())
      p.push_back(product_weight(
          spec("lm_head.weight", {V, C}, Init::Normal, 0.02f, "lm_head.weight")));
    return p;
  }

  void forward(UnitCtx& ctx, int call, const float* x, float* y) override {
    const Ops& ops = *ctx.ops;
    const Batch& bt = *ctx.batch;
    const int B = bt.B, T = bt.T, C = c_.d_model, V = c_.vocab_size;
    const int N = B * T;
    ScratchScope guard{ctx.scratch};
    if (T > c_.seq_len)
      fail("model", "batch sequence length " + std::to_string(T) + " exceeds model.seq_len = " +
                        std::to_string(c_.seq_len));
    if (call == 0) {
      ops.embedding_forward(y, bt.tokens, ctx.weight(0), ctx.param(1), B, T, C, V);  // (B,T,C)
      return;
    }
    SW_CHECK(call == 1, "embed_head has two calls");
    const float* lnw = ctx.param(2);  // (C)
    const float* lnb = ctx.param(3);  // (C)
    const size_t lm = head_index();
    const Operand w = ctx.weight(lm);  // (V,C), a product's weight
    if (!ctx.training && ctx.logits) {
      // Inference: logits of each sequence's last position only.
      float* xl = ctx.scratch->f32(sz(B, C));  // (B,C)
      for (int b = 0; b < B; ++b) ops.copy(xl + sz(b, C), x + sz(int64_t{b} * T + T - 1, C), sz(C));
      float* hl = ctx.scratch->f32(sz(B, C));
      float* mean = ctx.scratch->f32(sz(B));
      float* rstd = ctx.scratch->f32(sz(B));
      ops.layernorm_forward(hl, mean, rstd, xl, lnw, lnb, B, C);
      ops.linear_forward(ctx.logits, hl, w, nullptr, nullptr, B, C, V);  // (B,V)
      return;
    }
    SW_CHECK(ctx.batch->targets != nullptr, "a loss call needs targets");
    float* h = keep(ctx, kept::kLnf, sz(N, C));      // (N,C)
    float* mean = keep(ctx, kept::kLnfMean, sz(N));  // (N)
    float* rstd = keep(ctx, kept::kLnfRstd, sz(N));  // (N)
    ops.layernorm_forward(h, mean, rstd, x, lnw, lnb, N, C);
    float* losses = ctx.scratch->f32(sz(N));  // (N)
    // Fused: with gradient buffers at hand, the LM head's gradients are produced now (dw
    // accumulated into its gradient, dh stashed for backward), so the (N,V) logits are never
    // stored. Without them (eval, or a forward re-run without grads) backward does it.
    const bool fused = ctx.training && ctx.grads != nullptr;
    float* dh = nullptr;
    if (fused) {
      dh = ctx.saved->put(kept::kDlnf, sz(N, C));  // (N,C)
      ops.fill(dh, 0.f, sz(N, C));
    }
    if (ctx.training) ctx.saved->set(kept::kFused, fused);
    add_loss(ctx, losses, dh, fused ? ctx.grad(lm) : nullptr, h, w, C, V);
  }

  // Call 0 (embedding) allocates nothing. Call 1 (loss), training: lnf, its statistics, the
  // fused head's dlnf saved (the fused flag is a host scalar), the per-row losses in scratch; backward uses
  // no scratch (the head's gradients came with forward). Inference: everything in scratch.
  ActivationDecl declare_activations(int call, BatchShape shape) const override {
    ActivationDecl d;
    if (call == 0) return d;
    const size_t B = size_t(shape.B), N = B * size_t(shape.T), C = size_t(c_.d_model);
    d.saved = f32b(N * C) + 2 * f32b(N) + f32b(N * C);  // lnf, mean, rstd, dlnf
    d.scratch_fwd = scrb(N);                                      // losses
    d.scratch_eval = scrb(N * C) + 2 * scrb(N) + scrb(N);         // lnf, mean, rstd, losses
    d.scratch_logits = 2 * scrb(B * C) + 2 * scrb(B);             // xl, hl, mean, rstd
    return d;
  }

  void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) override {
    const Ops& ops = *ctx.ops;
    const Batch& bt = *ctx.batch;
    const int B = bt.B, T = bt.T, C = c_.d_model, V = c_.vocab_size;
    const int N = B * T;
    ScratchScope guard{ctx.scratch};
    if (call == 0) {
      ops.embedding_backward(ctx.grad(0), ctx.grad(1), dy, bt.tokens, B, T, C);
      return;
    }
    SW_CHECK(call == 1, "embed_head has two calls");
    const size_t lm = head_index();
    const float* h = ctx.saved->get(kept::kLnf);
    const float* mean = ctx.saved->get(kept::kLnfMean);
    const float* rstd = ctx.saved->get(kept::kLnfRstd);
    const float* dh;
    if (ctx.saved->flag(kept::kFused)) {
      dh = ctx.saved->get(kept::kDlnf);
    } else {
      float* d = ctx.scratch->f32(sz(N, C));
      ops.fill(d, 0.f, sz(N, C));
      float* losses = ctx.scratch->f32(sz(N));
      ops.lmhead_xent(losses, d, ctx.grad(lm), h, ctx.weight(lm), bt.targets, N, C, V,
                      ctx.grad_scale);
      dh = d;
    }
    ops.fill(dx, 0.f, sz(N, C));
    layernorm_backward_resid(ctx, dx, ctx.grad(2), ctx.grad(3), dh, x, ctx.param(2), mean, rstd,
                             N, C);
  }

 private:
  size_t head_index() const { return c_.tied() ? 0 : 4; }
  ModelConfig c_;
};

// ---- [1..L] blocks ---------------------------------------------------------------------------
class Block final : public Unit {
 public:
  Block(const ModelConfig& c, int layer) : c_(c), layer_(layer) {}
  std::string name() const override { return "h." + std::to_string(layer_); }

  enum : size_t { LN1W, LN1B, QKVW, QKVB, PROJW, PROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB };

  std::vector<ParamSpec> params() const override {
    const int64_t C = c_.d_model, F = c_.d_ff;
    const std::string n = name() + ".";
    const float res_std = 0.02f / std::sqrt(2.f * static_cast<float>(c_.n_layer));
    return {
        spec(n + "ln_1.weight", {C}, Init::Ones, 0.f, n + "ln_1.weight"),
        spec(n + "ln_1.bias", {C}, Init::Zeros, 0.f, n + "ln_1.bias"),
        linear_weight(spec(n + "attn.c_attn.weight", {3 * C, C}, Init::Normal, 0.02f, n + "attn.c_attn.weight", true)),
        spec(n + "attn.c_attn.bias", {3 * C}, Init::Zeros, 0.f, n + "attn.c_attn.bias"),
        linear_weight(spec(n + "attn.c_proj.weight", {C, C}, Init::Normal, res_std, n + "attn.c_proj.weight", true)),
        spec(n + "attn.c_proj.bias", {C}, Init::Zeros, 0.f, n + "attn.c_proj.bias"),
        spec(n + "ln_2.weight", {C}, Init::Ones, 0.f, n + "ln_2.weight"),
        spec(n + "ln_2.bias", {C}, Init::Zeros, 0.f, n + "ln_2.bias"),
        linear_weight(spec(n + "mlp.c_fc.weight", {F, C}, Init::Normal, 0.02f, n + "mlp.c_fc.weight", true)),
        spec(n + "mlp.c_fc.bias", {F}, Init::Zeros, 0.f, n + "mlp.c_fc.bias"),
        linear_weight(spec(n + "mlp.c_proj.weight", {C, F}, Init::Normal, res_std, n + "mlp.c_proj.weight", true)),
        spec(n + "mlp.c_proj.bias", {C}, Init::Zeros, 0.f, n + "mlp.c_proj.bias"),
    };
  }

  void forward(UnitCtx& ctx, int call, const float* x, float* y) override {
    const Ops& ops = *ctx.ops;
    const int B = ctx.batch->B, T = ctx.batch->T, C = c_.d_model, H = c_.n_head, F = c_.d_ff;
    const int N = B * T, hd = C / H;
    ScratchScope guard{ctx.scratch};
    auto P = [&](size_t i) { return ctx.param(i); };
    auto W = [&](size_t i) { return ctx.weight(i); };  // a product's weight (Operand)

    // ln1, ln2 and fch_gelu are the products' inputs, fch a product's output that only the GELU
    // reads: 16-bit with 16-bit products (ProductIn; fch as PyTorch's autocast keeps it).
    const ProductIn ln1 = keep_input(ctx, kept::kLn1, sz(N, C));  // (N,C)
    float* ln1_mean = keep(ctx, kept::kLn1Mean, sz(N));    // (N)
    float* ln1_rstd = keep(ctx, kept::kLn1Rstd, sz(N));    // (N)
    // (N,3C) [q | k | v] and (N,C) attention's output: attention's and the products' operands,
    // 16-bit with 16-bit products.
    const ProductIn qkv = keep_input(ctx, kept::kQkv, sz(N, 3 * C));
    const ProductIn atty = keep_input(ctx, kept::kAtty, sz(N, C));
    float* lse = keep(ctx, kept::kLse, sz(B, int64_t{H} * T));  // (B,H,T)
    float* x2 = keep(ctx, kept::kX2, sz(N, C));             // (N,C) residual after attention
    const ProductIn ln2 = keep_input(ctx, kept::kLn2, sz(N, C));  // (N,C)
    float* ln2_mean = keep(ctx, kept::kLn2Mean, sz(N));    // (N)
    float* ln2_rstd = keep(ctx, kept::kLn2Rstd, sz(N));    // (N)
    const ProductIn fch = keep_input(ctx, kept::kFch, sz(N, F));  // (N,F) before GELU
    const ProductIn fch_gelu = keep_input(ctx, kept::kFchGelu, sz(N, F));  // (N,F)

    ops.layernorm_forward(ln1.out(), ln1_mean, ln1_rstd, x, P(LN1W), P(LN1B), N, C);
    if (qkv.lp) {  // the product in fp32 (scratch), narrowed into the kept 16-bit qkv
      float* q32 = ctx.scratch->f32(sz(N, 3 * C));
      ops.linear_forward(q32, ln1.operand(), W(QKVW), P(QKVB), nullptr, N, C, 3 * C);
      ops.narrow(ops.compute(), q32, qkv.lp, sz(N, 3 * C));
    } else {
      ops.linear_forward(qkv.f32, ln1.operand(), W(QKVW), P(QKVB), nullptr, N, C, 3 * C);
    }
    ops.attention_forward(atty.out(), lse, qkv.operand(), B, T, H, H, hd);
    linear_residual_layernorm_to(ops, x2, ln2, ln2_mean, ln2_rstd, atty.operand(), W(PROJW),
                                 P(PROJB), x, P(LN2W), P(LN2B), N, C, C);
    ops.linear_forward(fch.out(), ln2.operand(), W(FCW), P(FCB), nullptr, N, C, F);
    ops.gelu_forward(fch_gelu.out(), fch.operand(), sz(N, F));
    linear_residual_to(ops, y, fch_gelu.operand(), W(FCPROJW), P(FCPROJB), x2, N, F, C);
  }

  // Forward keeps (in this order) ln1, ln1_mean, ln1_rstd, qkv, atty, lse, x2, ln2, ln2_mean,
  // ln2_rstd, fch, fch_gelu (ln1, qkv, atty, ln2, fch and fch_gelu 2 bytes a value with 16-bit
  // products, qkv's fp32 product then in scratch): in Saved when training, in scratch in
  // inference. recompute_cheap: two (N) statistics in
  // scratch; backward: the six input gradients (written, not zeroed first).
  ActivationDecl declare_activations(int /*call*/, BatchShape shape) const override {
    const size_t B = size_t(shape.B), N = B * size_t(shape.T), C = size_t(c_.d_model),
                 H = size_t(c_.n_head), F = size_t(c_.d_ff);
    const size_t kept[] = {N, N, B * H * size_t(shape.T), N * C, N, N};
    // ln1, qkv, atty, ln2, fch, fch_gelu
    const size_t inputs[] = {N * C, N * 3 * C, N * C, N * C, N * F, N * F};
    ActivationDecl d;
    for (size_t n : kept) d.saved += f32b(n), d.scratch_eval += scrb(n);
    for (size_t n : inputs) {
      d.saved += shape.input_bytes(n);
      d.scratch_eval += shape.input_scratch(n);
    }
    d.saved_cheap = shape.input_bytes(N * C) * 2 + shape.input_bytes(N * F);  // ln1, ln2, fch_gelu
    if (shape.lowp()) {  // qkv's fp32 product
      d.scratch_fwd = scrb(N * 3 * C);
      d.scratch_eval += scrb(N * 3 * C);
    }
    d.scratch_logits = d.scratch_eval;
    d.scratch_recompute = 2 * scrb(N);
    // dfch_gelu, dfch, dln2, datty, dqkv, dln1 (all but dln2 and dln1 ProductIns)
    d.scratch_bwd = shape.input_scratch(N * F) + shape.input_scratch(N * F) + scrb(N * C) +
                    shape.input_scratch(N * C) + shape.input_scratch(N * 3 * C) + scrb(N * C);
    return d;
  }

  // Selective: ln1, ln2 and fch_gelu from x, x2 and fch, bit-identical to forward (ln2 is the
  // plain LayerNorm of the saved x2, which forward's fused residual + LayerNorm matches bit for
  // bit; the norm statistics are recomputed into scratch, the saved ones stay).
  bool selective_recompute() const override { return true; }
  void recompute_cheap(UnitCtx& ctx, int /*call*/, const float* x) override {
    const Ops& ops = *ctx.ops;
    const int N = ctx.batch->B * ctx.batch->T, C = c_.d_model, F = c_.d_ff;
    ScratchScope guard{ctx.scratch};
    Saved& s = *ctx.saved;
    float* mean = ctx.scratch->f32(sz(N));
    float* rstd = ctx.scratch->f32(sz(N));
    ops.layernorm_forward(saved_input(s, kept::kLn1, sz(N, C), ops).out(), mean, rstd, x,
                          ctx.param(LN1W), ctx.param(LN1B), N, C);
    ops.layernorm_forward(saved_input(s, kept::kLn2, sz(N, C), ops).out(), mean, rstd,
                          s.get(kept::kX2), ctx.param(LN2W), ctx.param(LN2B), N, C);
    ops.gelu_forward(saved_input(s, kept::kFchGelu, sz(N, F), ops).out(),
                     saved_input(s, kept::kFch, ops).operand(), sz(N, F));
  }

  // dy is read by the first product only, before dx is first written (the norm's backward
  // adds into it), so dx may be dy.
  bool backward_in_place() const override { return true; }

  void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) override {
    const Ops& ops = *ctx.ops;
    const int B = ctx.batch->B, T = ctx.batch->T, C = c_.d_model, H = c_.n_head, F = c_.d_ff;
    const int N = B * T, hd = C / H;
    ScratchScope guard{ctx.scratch};
    auto P = [&](size_t i) { return ctx.param(i); };
    auto W = [&](size_t i) { return ctx.weight(i); };  // a product's weight (Operand)
    auto G = [&](size_t i) { return ctx.grad(i); };
    auto GO = [&](size_t i) { return ctx.grad_out(i); };  // a product's weight / bias gradient
    const Saved& s = *ctx.saved;
    // Each input gradient below lands in a fresh scratch region, written (GradIn::set).
    auto fresh = [&](size_t n) { return ctx.scratch->f32(n); };

    // dx starts as dy (the residual path) and collects dL/dx2, then dL/dx.
    if (dx != dy) ops.copy(dx, dy, sz(N, C));
    // MLP: y = x2 + fcproj(gelu(fc(ln2(x2)))). dfch_gelu, which only the GELU reads: 16-bit
    // with 16-bit products.
    const ProductIn dfch_gelu = scratch_input(*ctx.scratch, sz(N, F), ops);
    ops.linear_backward(dfch_gelu.set(), GO(FCPROJW), GO(FCPROJB), dy_operand(ctx, dy),
                        saved_input(s, kept::kFchGelu, ops).operand(), W(FCPROJW), N, F, C);
    // dfch and dqkv feed biased products: 16-bit with 16-bit products, for the products and
    // for the bias gradient, which sums their widened values (as autocast's backward sums a
    // linear's 16-bit output gradient).
    const ProductIn dfch = scratch_input(*ctx.scratch, sz(N, F), ops);
    ops.gelu_backward(dfch.set(), saved_input(s, kept::kFch, ops).operand(), dfch_gelu.operand(),
                      sz(N, F));
    float* dln2 = fresh(sz(N, C));
    ops.linear_backward(GradIn::set(dln2), GO(FCW), GO(FCB), dfch.operand(),
                        saved_input(s, kept::kLn2, ops).operand(), W(FCW), N, C, F);
    layernorm_backward_resid(ctx, dx, G(LN2W), G(LN2B), dln2, s.get(kept::kX2), P(LN2W),
                             s.get(kept::kLn2Mean), s.get(kept::kLn2Rstd), N, C);
    // Attention: x2 = x + proj(attn(qkv(ln1(x)))); dx now holds dL/dx2.
    // datty, which only attention reads: 16-bit with 16-bit products.
    const ProductIn qkv = saved_input(s, kept::kQkv, ops), atty = saved_input(s, kept::kAtty, ops);
    const ProductIn datty = scratch_input(*ctx.scratch, sz(N, C), ops);
    ops.linear_backward(datty.set(), GO(PROJW), GO(PROJB), dx_operand(ctx, dx), atty.operand(),
                        W(PROJW), N, C, C);
    // (16-bit: cuDNN's own 16-bit dQ, dK, dV; the CPU's fp32 values narrowed)
    const ProductIn dqkv = scratch_input(*ctx.scratch, sz(N, 3 * C), ops);
    ops.attention_backward(dqkv.set(), datty.operand(), qkv.operand(), atty.operand(),
                           s.get(kept::kLse), B, T, H, H, hd);
    float* dln1 = fresh(sz(N, C));
    ops.linear_backward(GradIn::set(dln1), GO(QKVW), GO(QKVB), dqkv.operand(),
                        saved_input(s, kept::kLn1, ops).operand(), W(QKVW), N, C, 3 * C);
    layernorm_backward_resid(ctx, dx, G(LN1W), G(LN1B), dln1, x, P(LN1W), s.get(kept::kLn1Mean),
                             s.get(kept::kLn1Rstd), N, C);
  }

 private:
  ModelConfig c_;
  int layer_;
};

}  // namespace

void build_gpt2(Model& m) {
  const ModelConfig& c = m.config;
  m.units.push_back(std::make_unique<EmbedHead>(c));
  for (int l = 0; l < c.n_layer; ++l) m.units.push_back(std::make_unique<Block>(c, l));
  m.schedule.push_back({0, 0});
  for (int l = 0; l < c.n_layer; ++l) m.schedule.push_back({l + 1, 0});
  m.schedule.push_back({0, 1});
}

}  // namespace sw
