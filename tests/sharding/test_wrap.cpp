// The wrap policy (sharding/wrap.h) and the sharding policy names (sharding/policy.h), one
// process. A model whose blocks are grouped into composite units must compute exactly what the
// unwrapped model computes: each block runs the same kernels on the same values, so losses,
// gradients, parameters after training and logits are bit-identical (clipping off, so the
// norm's summation order cannot leak in).
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/policy.h"
#include "sharding/sharded_model.h"
#include "sharding/wrap.h"

using namespace sw;
using Catch::Matchers::Contains;

namespace {

ModelConfig tiny(const std::string& type, int layers) {
  ModelConfig c;
  c.type = type;
  c.vocab_size = 64;
  c.n_layer = layers;
  c.d_model = 32;
  c.seq_len = 16;
  c.n_head = type == "gpt2" ? 2 : 4;
  if (type == "llama") c.n_kv_head = 2, c.d_ff = 64;
  return c;
}

struct Trace {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params, grads;
  std::vector<float> logits;
  std::vector<std::string> names;  // parameter order
};

Trace run(const ModelConfig& mc, int bpu, int steps) {
  Model m = build_model(mc);
  wrap_blocks(m, bpu);
  ShardedModel sm(m, ops_for(Device::cpu()), 5);
  const int B = 3, T = mc.seq_len;
  std::vector<int32_t> tok(size_t(B) * T), tgt(size_t(B) * T);
  Trace tr;
  for (int s = 0; s < steps; ++s) {
    Rng r(100 + s);
    for (auto& t : tok) t = int32_t(r.below(64));
    for (auto& t : tgt) t = int32_t(r.below(64));
    sm.zero_grads();
    tr.losses.push_back(sm.forward_backward(Batch{tok.data(), tgt.data(), B, T}));
    if (s + 1 == steps)
      sm.for_each_grad([&](const ParamSpec& p, const float* g) {
        tr.grads[p.name].assign(g, g + numel(p.shape));
      });
    sm.optimizer_step(AdamWParams{}, 1e-2f, 1.f, s + 1);
  }
  sm.for_each_param([&](const ParamSpec& p, const float* x) {
    tr.params[p.name].assign(x, x + numel(p.shape));
    tr.names.push_back(p.name);
  });
  tr.logits.resize(size_t(B) * 64);
  sm.logits_last(Batch{tok.data(), tgt.data(), B, T}, tr.logits.data());
  return tr;
}

}  // namespace

TEST_CASE("wrap_blocks groups consecutive blocks into units", "[sharding][wrap]") {
  for (const std::string type : {"gpt2", "llama"}) {
    INFO(type);
    Model plain = build_model(tiny(type, 5));
    const size_t U = plain.units.size(), P = plain.schedule.size();
    Model m = build_model(tiny(type, 5));
    wrap_blocks(m, 2);  // blocks 0-1, 2-3, 4
    CHECK(m.units.size() == U - 2);
    CHECK(m.schedule.size() == P - 2);
    const std::string first_name = plain.units[size_t(plain.schedule[1].unit)]->name(),
                      second_name = plain.units[size_t(plain.schedule[2].unit)]->name();
    CHECK(m.units[size_t(m.schedule[1].unit)]->name() == first_name + ".." + second_name);
    CHECK(m.num_params() == plain.num_params());
    // The embedding (first call) and the head/loss (last call) stay alone and keep their calls.
    CHECK(m.schedule.front().call == plain.schedule.front().call);
    CHECK(m.schedule.back().call == plain.schedule.back().call);
    Model one = build_model(tiny(type, 5));
    wrap_blocks(one, 1);
    CHECK(one.units.size() == U);
    Model all = build_model(tiny(type, 5));
    wrap_blocks(all, 100);
    CHECK(all.schedule.size() == P - 4);
  }
}

TEST_CASE("a wrapped model trains bit-identically to the unwrapped one", "[sharding][wrap]") {
  for (const std::string type : {"gpt2", "llama"}) {
    for (int bpu : {2, 3}) {
      INFO(type << " blocks_per_unit " << bpu);
      const ModelConfig mc = tiny(type, 4);
      const Trace a = run(mc, 1, 4), b = run(mc, bpu, 4);
      CHECK(a.names == b.names);
      CHECK(a.losses == b.losses);
      CHECK(a.grads == b.grads);
      CHECK(a.params == b.params);
      CHECK(a.logits == b.logits);
    }
  }
}

TEST_CASE("sharding policy names and stages", "[sharding]") {
  for (ShardingStrategy s :
       {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
        ShardingStrategy::ShardOptimizer, ShardingStrategy::NoShard, ShardingStrategy::HybridShard})
    CHECK(strategy_from_name(strategy_name(s)) == s);
  for (int st = 0; st <= 3; ++st) CHECK(stage_of(strategy_from_stage(st)) == st);
  CHECK(stage_of(ShardingStrategy::HybridShard) == 3);
  CHECK_THROWS_WITH(strategy_from_name("FULLSHARD"),
                    Contains("unknown sharding strategy 'FULLSHARD'"));
  CHECK_THROWS_WITH(strategy_from_stage(4), Contains("ZeRO stage must be 0, 1, 2 or 3"));
  CHECK(ShardingPolicy::for_strategy(ShardingStrategy::FullShard).reshard_after_forward);
  CHECK(!ShardingPolicy::for_strategy(ShardingStrategy::ShardGradOp).reshard_after_forward);
  CHECK(ShardingPolicy::for_strategy(ShardingStrategy::NoShard).accum == GradAccumMode::ReduceOnce);
  CHECK(ShardingPolicy::for_strategy(ShardingStrategy::FullShard).accum ==
        GradAccumMode::ReduceEachMicroStep);
  CHECK(accum_mode_from_name("reduce_once") == GradAccumMode::ReduceOnce);
  CHECK_THROWS_WITH(accum_mode_from_name("once"),
                    Contains("reduce_each_micro_step or reduce_once"));
}

TEST_CASE("one rank: every strategy is the same computation", "[sharding]") {
  // With one rank nothing is sharded, whatever the policy: identical results.
  const ModelConfig mc = tiny("gpt2", 2);
  std::vector<double> ref;
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                             ShardingStrategy::ShardOptimizer, ShardingStrategy::NoShard,
                             ShardingStrategy::HybridShard}) {
    Model m = build_model(mc);
    ShardedModel sm(m, ops_for(Device::cpu()), 5, make_local_group(),
                    ShardingPolicy::for_strategy(s));
    std::vector<int32_t> tok(2 * 16, 7), tgt(2 * 16, 9);
    std::vector<double> losses;
    for (int step = 1; step <= 3; ++step) {
      sm.zero_grads();
      losses.push_back(sm.forward_backward(Batch{tok.data(), tgt.data(), 2, 16}));
      sm.optimizer_step(AdamWParams{}, 1e-2f, 1.f / float(1 + sm.grad_norm()), step);
    }
    if (ref.empty()) ref = losses;
    INFO(strategy_name(s));
    CHECK(losses == ref);
  }
}

TEST_CASE("ShardedModel rejects a shard group that does not divide the world", "[sharding]") {
  Model m = build_model(tiny("gpt2", 2));
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::HybridShard);
  p.shard_group_size = 2;  // world is 1
  CHECK_THROWS_WITH(ShardedModel(m, ops_for(Device::cpu()), 1, make_local_group(), p),
                    Contains("shard_group_size (2) must divide the world size (1)"));
}
