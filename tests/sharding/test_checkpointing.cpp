// Activation checkpointing at one rank (sharding/policy.h, models/unit.h "recompute"):
//   * gradients and losses are bit-identical (memcmp) to a run without checkpointing for
//     GPT-2 and Llama, full and selective, every unit, every 2nd unit and a list, over two
//     optimizer steps of two accumulated micro-batches, under FULL_SHARD, SHARD_GRAD_OP and
//     NO_SHARD policies and with blocks_per_unit composites;
//   * a custom unit without selective support works under Selective (full recompute);
//   * peak Mem::Activations of a forward_backward: full checkpointing keeps the unit inputs
//     plus about one unit's Saved (bound computed from the model's buffer sizes), selective
//     sits in between, and both are well below no checkpointing.
#include <catch2/catch.hpp>
#include <cmath>

#include "ckpt_common.h"
#include "core/alloc.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "sharding/comm/group.h"
#include "sharding/wrap.h"

using namespace sw;
using namespace ckpt;

namespace {

const Ops& cpu() { return ops_for(Device::cpu()); }

Snapshot train(const ModelConfig& mc, ShardingPolicy policy, const ActivationCheckpointing& ac,
               int blocks_per_unit = 1) {
  Model m = build_model(mc);
  wrap_blocks(m, blocks_per_unit);
  policy.activation_checkpointing = ac;
  ShardedModel sm(m, cpu(), 7, make_local_group(), policy);
  Data a(3, 12, mc.vocab_size, 1), b(3, 12, mc.vocab_size, 2);
  return run(sm, {&a, &b}, 2);
}

// ---- A custom model: embedding + blocks y = x + tanh(x W^T) + a loss unit; no selective ----
constexpr int kV = 32, kC = 16;

ParamSpec pspec(std::string name, Shape shape, Init init) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.init = init;
  p.std = 0.3f;
  return p;
}

class Embed final : public Unit {
 public:
  std::string name() const override { return "embed"; }
  std::vector<ParamSpec> params() const override { return {pspec("wte", {kV, kC}, Init::Normal)}; }
  void forward(UnitCtx& c, int, const float*, float* y) override {
    c.ops->embedding_forward(y, c.batch->tokens, c.param(0), nullptr, c.batch->B, c.batch->T, kC,
                             kV);
  }
  void backward(UnitCtx& c, int, const float*, const float* dy, float*) override {
    c.ops->embedding_backward(c.grad(0), nullptr, dy, c.batch->tokens, c.batch->B, c.batch->T, kC);
  }
};

constexpr SavedSlot<float> kT{0, Keep::Always, "t"};  // what TanhBlock keeps

class TanhBlock final : public Unit {
 public:
  explicit TanhBlock(int i) : n_("h." + std::to_string(i)) {}
  std::string name() const override { return n_; }
  std::vector<ParamSpec> params() const override { return {pspec(n_ + ".w", {kC, kC}, Init::Normal)}; }
  void forward(UnitCtx& c, int, const float* x, float* y) override {
    const size_t n = size_t(c.batch->B) * c.batch->T * kC;
    float* t = c.saved->put(kT, n);
    c.ops->linear_forward(t, x, c.param(0), nullptr, nullptr, c.batch->B * c.batch->T, kC, kC);
    for (size_t i = 0; i < n; ++i) t[i] = std::tanh(t[i]);
    for (size_t i = 0; i < n; ++i) y[i] = x[i] + t[i];
    ++forwards;
  }
  void backward(UnitCtx& c, int, const float* x, const float* dy, float* dx) override {
    const size_t n = size_t(c.batch->B) * c.batch->T * kC;
    const float* t = c.saved->get(kT);
    float* u = c.scratch->f32(n);
    for (size_t i = 0; i < n; ++i) u[i] = dy[i] * (1.f - t[i] * t[i]);
    c.ops->copy(dx, dy, n);
    c.ops->linear_backward(dx, c.grad(0), nullptr, u, x, c.param(0), c.batch->B * c.batch->T, kC, kC);
  }
  int forwards = 0;

 private:
  std::string n_;
};

class Loss final : public Unit {
 public:
  std::string name() const override { return "head"; }
  std::vector<ParamSpec> params() const override { return {pspec("head", {kV, kC}, Init::Normal)}; }
  void forward(UnitCtx& c, int, const float* x, float*) override {
    const int N = c.batch->B * c.batch->T;
    c.loss_sum += c.ops->lmhead_xent(c.scratch->f32(size_t(N)), nullptr, nullptr, x, c.param(0),
                                     c.batch->targets, N, kC, kV, 0.f);
    for (int i = 0; i < N; ++i) c.loss_count += c.batch->targets[i] >= 0;
  }
  void backward(UnitCtx& c, int, const float* x, const float*, float* dx) override {
    const int N = c.batch->B * c.batch->T;
    c.ops->fill(dx, 0.f, size_t(N) * kC);
    c.ops->lmhead_xent(c.scratch->f32(size_t(N)), dx, c.grad(0), x, c.param(0), c.batch->targets,
                       N, kC, kV, c.grad_scale);
  }
};

Model custom_model(int blocks) {
  Model m;
  m.config.type = "custom";
  m.config.vocab_size = kV;
  m.config.d_model = kC;
  m.config.n_layer = blocks;
  m.units.push_back(std::make_unique<Embed>());
  for (int i = 0; i < blocks; ++i) m.units.push_back(std::make_unique<TanhBlock>(i));
  m.units.push_back(std::make_unique<Loss>());
  for (int u = 0; u < blocks + 2; ++u) m.schedule.push_back({u, 0});
  return m;
}

// Peak Mem::Activations (above what was live before) of one forward_backward.
size_t act_peak(ShardedModel& sm, const Batch& b) {
  MemTracker& mt = MemTracker::global();
  const size_t base = mt.current(Mem::Activations);
  mt.reset_peaks();
  sm.zero_grads();
  sm.forward_backward(b);
  CHECK(mt.current(Mem::Activations) == base);
  return mt.peak(Mem::Activations) - base;
}

}  // namespace

TEST_CASE("checkpointing: gradients bit-identical to no checkpointing (GPT-2, Llama)",
          "[sharding][checkpointing]") {
  for (const char* type : {"gpt2", "llama"}) {
    const ModelConfig mc = tiny(type);
    for (ShardingStrategy st : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                                ShardingStrategy::NoShard}) {
      const ShardingPolicy pol = ShardingPolicy::for_strategy(st);
      const Snapshot ref = train(mc, pol, ac_of(CheckpointMode::Off));
      REQUIRE(ref.grads.size() > 1000);
      for (const Variant& v : variants()) {
        if (v.ac.mode == CheckpointMode::Off) continue;
        INFO(type << " " << strategy_name(st) << " " << v.name);
        CHECK(train(mc, pol, v.ac).same_bits(ref));
      }
    }
    // Prefetch depth 0 and 2 change when parameters arrive, never what recompute sees.
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    const Snapshot ref = train(mc, pol, ac_of(CheckpointMode::Off));
    for (int depth : {0, 2}) {
      pol.forward_prefetch = pol.backward_prefetch = depth;
      INFO(type << " prefetch " << depth);
      CHECK(train(mc, pol, ac_of(CheckpointMode::Full)).same_bits(ref));
      CHECK(train(mc, pol, ac_of(CheckpointMode::Selective)).same_bits(ref));
    }
  }
}

TEST_CASE("checkpointing: blocks_per_unit composites recompute bit-identically",
          "[sharding][checkpointing]") {
  for (const char* type : {"gpt2", "llama"}) {
    const ModelConfig mc = tiny(type);
    const ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    const Snapshot ref = train(mc, pol, ac_of(CheckpointMode::Off), 2);
    for (CheckpointMode mode : {CheckpointMode::Full, CheckpointMode::Selective}) {
      INFO(type << " " << checkpoint_mode_name(mode));
      CHECK(train(mc, pol, ac_of(mode), 2).same_bits(ref));
      CHECK(train(mc, pol, ac_of(mode, 1, {2}), 2).same_bits(ref));
    }
  }
}

TEST_CASE("checkpointing: a custom unit without selective support recomputes fully",
          "[sharding][checkpointing]") {
  auto go = [](CheckpointMode mode, size_t* peak, int* forwards) {
    Model m = custom_model(3);
    auto* blk = static_cast<TanhBlock*>(m.units[1].get());
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    pol.activation_checkpointing = ac_of(mode);
    ShardedModel sm(m, cpu(), 3, make_local_group(), pol);
    Data d(4, 8, kV, 5);
    *peak = act_peak(sm, d.batch);
    *forwards = blk->forwards;
    Snapshot s;
    sm.for_each_grad([&](const ParamSpec& p, const float* g) {
      s.grads.insert(s.grads.end(), g, g + numel(p.shape));
    });
    return s;
  };
  size_t p_off, p_full, p_sel;
  int f_off, f_full, f_sel;
  const Snapshot off = go(CheckpointMode::Off, &p_off, &f_off);
  const Snapshot full = go(CheckpointMode::Full, &p_full, &f_full);
  const Snapshot sel = go(CheckpointMode::Selective, &p_sel, &f_sel);
  CHECK(full.same_bits(off));
  CHECK(sel.same_bits(off));
  CHECK(f_off == 1);
  CHECK(f_full == 2);  // forward, then recompute before backward
  CHECK(f_sel == 2);   // Selective falls back to a full recompute
  CHECK(p_sel == p_full);
  // Off: 4 call inputs + 3 saved tanh outputs; full: 4 inputs + one saved output.
  const size_t btc = size_t(4) * 8 * kC * 4;
  CHECK(p_off == 7 * btc);
  CHECK(p_full == 5 * btc);
}

TEST_CASE("checkpointing: peak activation memory (GPT-2, Llama)", "[sharding][checkpointing]") {
  for (const char* type : {"gpt2", "llama"}) {
    ModelConfig mc = tiny(type);
    mc.n_layer = 6;
    const int B = 4, T = 16, L = mc.n_layer;
    const size_t N = size_t(B) * T, C = size_t(mc.d_model), H = size_t(mc.n_head);
    // One block's Saved and its Keep::Cheap part, in floats, from the model's definition.
    size_t block, cheap;
    if (mc.type == "gpt2") {
      const size_t F = 4 * C;
      // ln1, ln1 stats, qkv, atty, lse, x2, ln2, ln2 stats, fch, fch_gelu
      block = N * (C + 2 + 3 * C + C + H + C + C + 2 + F + F);
      cheap = N * (2 * C + F);  // ln1, ln2, fch_gelu
    } else {
      const size_t F = size_t(mc.d_ff), hd = C / H, KVH = size_t(mc.n_kv_head);
      // xn, rstd1, qkv, atty, lse, x2, xn2, rstd2, gu, hmlp
      block = N * (C + 1 + (H + 2 * KVH) * hd + C + H + C + C + 1 + 2 * F + F);
      cheap = N * (2 * C + F);  // xn, xn2, hmlp
    }
    block *= 4, cheap *= 4;
    // Inputs kept by the engine: one (B,T,C) per schedule position after the first.
    const size_t positions = mc.type == "gpt2" ? size_t(L) + 2 : size_t(L) + 2;
    const size_t inputs = (positions - 1) * N * C * 4;

    size_t peak[3];
    const CheckpointMode modes[3] = {CheckpointMode::Off, CheckpointMode::Selective,
                                     CheckpointMode::Full};
    for (int i = 0; i < 3; ++i) {
      Model m = build_model(mc);
      ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
      pol.activation_checkpointing = ac_of(modes[i]);
      ShardedModel sm(m, cpu(), 3, make_local_group(), pol);
      Data d(B, T, mc.vocab_size, 9);
      act_peak(sm, d.batch);  // warm-up (first-step allocations)
      peak[i] = act_peak(sm, d.batch);
    }
    INFO(type << ": inputs " << inputs << ", block " << block << ", cheap " << cheap << "; peak off "
              << peak[0] << ", selective " << peak[1] << ", full " << peak[2]);
    CHECK(peak[0] >= inputs + size_t(L) * block);
    CHECK(peak[2] >= inputs + block);
    CHECK(peak[2] <= inputs + block + block / 2);
    CHECK(peak[1] <= inputs + size_t(L) * (block - cheap) + cheap + cheap / 2);
    CHECK(peak[1] > peak[2]);
    CHECK(peak[1] < peak[0]);
    CHECK(double(peak[2]) < 0.4 * double(peak[0]));
  }
}
