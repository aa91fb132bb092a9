// SGD, LARS and Lamb sharded (label mpi; mpirun -np 2 and 4): every configuration of the
// PyTorch reference file (optimizer_common.h) run for 50 steps on N ranks under FULL_SHARD,
// SHARD_GRAD_OP, NO_SHARD and HYBRID_SHARD (shard groups of 2) ends within 1e-6 of the same
// run on one rank: LARS's and Lamb's per-tensor norms are summed over the shard group, whose
// shards cut the tensors at other places than one rank's. Then a tiny GPT-2 on the simulated
// accelerator with offload_optimizer cpu (the host updater) at N ranks against the CPU.
// Every rank runs every TEST_CASE in order with CHECK only (no REQUIRE), so that a failure
// never leaves a rank waiting in a collective.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/mpi_test_util.h"
#include "common/sim_device.h"
#include "core/alloc.h"
#include "optimizer_common.h"
#include "sharding/comm/group.h"

using namespace sw;

namespace {

using Params = std::map<std::string, std::vector<float>>;

double max_diff(const Params& a, const Params& b) {
  double worst = 0;
  for (const auto& [n, v] : a) {
    const auto it = b.find(n);
    if (it == b.end() || it->second.size() != v.size()) return 1e30;
    for (size_t i = 0; i < v.size(); ++i)
      worst = std::max(worst, double(std::fabs(v[i] - it->second[i])));
  }
  return worst;
}

std::vector<std::pair<std::string, ShardingPolicy>> policies(int world) {
  ShardingPolicy hybrid = ShardingPolicy::for_strategy(ShardingStrategy::HybridShard);
  hybrid.shard_group_size = world % 2 == 0 ? 2 : 1;
  return {{"FULL_SHARD", ShardingPolicy::for_strategy(ShardingStrategy::FullShard)},
          {"SHARD_GRAD_OP", ShardingPolicy::for_strategy(ShardingStrategy::ShardGradOp)},
          {"NO_SHARD", ShardingPolicy::for_strategy(ShardingStrategy::NoShard)},
          {"HYBRID_SHARD", hybrid}};
}

}  // namespace

TEST_CASE("sharded optimizers equal one rank", "[optimizers]") {
  GroupPtr w = swtest::world();
  const nlohmann::json ref = optest::reference();
  for (const auto& c : ref.at("configs")) {
    const std::string name = c.at("name").get<std::string>();
    float gm = 1.f;
    const OptimizerParams p = optest::params_of(c, &gm);
    Model m1 = optest::make_model();
    ShardedModel one(m1, swtest::cpu(), 1, make_local_group(),
                     ShardingPolicy::for_strategy(ShardingStrategy::FullShard));
    const Params want = optest::run(one, p, gm, 50, {50}).at(50);
    for (const auto& [pn, pol] : policies(w->size())) {
      INFO(name << " " << pn << " at " << w->size() << " ranks");
      Model m = optest::make_model();
      ShardedModel sm(m, swtest::cpu(), 1, w, pol);
      const auto got = optest::run(sm, p, gm, 50, {50});
      CHECK(max_diff(want, got.at(50)) <= 1e-6);
    }
  }
}

namespace {

struct Run {
  std::vector<double> losses;
  Params params;
};

// Eight steps of a tiny GPT-2 at every rank of `g` (each its own rows), clipping at norm 1.
Run train_gpt(const Ops& ops, GroupPtr g, const ShardingPolicy& pol, const OptimizerParams& p) {
  const ModelConfig cfg = swtest::tiny_config("gpt2");
  Model m = build_model(cfg);
  ShardedModel sm(m, ops, 77, g, pol);
  std::vector<int32_t> tok(size_t(2) * cfg.seq_len), tgt(tok.size());
  Rng r(11 + uint64_t(g->rank()));
  for (auto& t : tok) t = int32_t(r.below(uint64_t(cfg.vocab_size)));
  for (auto& t : tgt) t = int32_t(r.below(uint64_t(cfg.vocab_size)));
  const Batch b{tok.data(), tgt.data(), 2, cfg.seq_len};
  Run out;
  for (int step = 1; step <= 8; ++step) {
    sm.zero_grads();
    sm.micro_step(b);
    const double norm = sm.grad_norm();
    for (double l : sm.step_losses()) out.losses.push_back(l);
    sm.optimizer_step(p, p.lr, norm > 1.0 ? float(1.0 / norm) : 1.f, step);
  }
  sm.for_each_param([&](const ParamSpec& s, const float* d) {
    out.params[s.name].assign(d, d + numel(s.shape));
  });
  return out;
}

}  // namespace

TEST_CASE("sharded optimizers with offload_optimizer cpu on a device equal the CPU",
          "[optimizers]") {
  GroupPtr w = swtest::world();
  OptimizerParams lars, lamb;
  lars.type = OptimizerType::LARS, lars.lr = 1.f, lars.momentum = 0.9f;
  lars.weight_decay = 1e-3f, lars.trust_coefficient = 0.01f;
  lamb.type = OptimizerType::Lamb, lamb.lr = 0.01f, lamb.beta2 = 0.999f, lamb.weight_decay = 0.01f;
  for (const auto& [name, p] : {std::pair{"LARS", lars}, std::pair{"Lamb", lamb}}) {
    for (const auto& [pn, pol] : policies(w->size())) {
      if (pn == "SHARD_GRAD_OP") continue;
      INFO(name << " " << pn << " at " << w->size() << " ranks");
      const Run want = train_gpt(swtest::cpu(), w, pol, p);
      ShardingPolicy off = pol;
      off.offload_optimizer.device = OffloadDevice::Cpu;
      const Run got = train_gpt(ops_for(Device::sim(0)), w, off, p);
      CHECK(got.losses.size() == want.losses.size());
      for (size_t i = 0; i < std::min(got.losses.size(), want.losses.size()); ++i)
        CHECK(got.losses[i] == Approx(want.losses[i]).epsilon(1e-6));
      CHECK(max_diff(want.params, got.params) <= 1e-6);
    }
  }
}
