// SGD (momentum, Nesterov, dampening), LARS and Lamb at one rank against PyTorch: the
// parameters after 1 and 50 steps on fixed gradients equal those tests/sharding/
// gen_optimizer_reference.py computed with torch.optim.SGD and the published LARS (LARC) and
// Lamb (DeepSpeed's FusedLamb) formulas (tests/sharding/data/optimizer_reference.json).
// On the simulated accelerator with offload_optimizer cpu (the host updater; Lamb's first half
// on host copies), and with bf16 parameters, a tiny GPT-2 trains as on the CPU; SGD streams
// its momentum through NVMe bit-identically.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/sim_device.h"
#include "common/temp_dir.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/config.h"
#include "optimizer_common.h"
#include "sharding/comm/group.h"

using namespace sw;

TEST_CASE("optimizers equal PyTorch's over 50 steps", "[optimizers]") {
  const nlohmann::json ref = optest::reference();
  REQUIRE(ref.at("configs").size() >= 8);
  for (const auto& c : ref.at("configs")) {
    const std::string name = c.at("name").get<std::string>();
    INFO(name);
    float gm = 1.f;
    const OptimizerParams p = optest::params_of(c, &gm);
    Model m = optest::make_model();
    ShardedModel sm(m, ops_for(Device::cpu()), 1);
    const auto got = optest::run(sm, p, gm, 50, {1, 50});
    for (int t : {1, 50}) {
      double worst = 0, scale = 0;
      for (const auto& [tn, want] : c.at("after").at(std::to_string(t)).items()) {
        const std::vector<float>& v = got.at(t).at(tn);
        REQUIRE(v.size() == want.size());
        for (size_t i = 0; i < v.size(); ++i) {
          worst = std::max(worst, std::fabs(double(v[i]) - want[i].get<double>()));
          scale = std::max(scale, std::fabs(want[i].get<double>()));
        }
      }
      INFO("after " << t << " steps: max |shardwise - torch| " << worst << " (max |p| " << scale
                    << ")");
      CHECK(worst <= (t == 1 ? 1e-6 : 5e-6) * std::max(1.0, scale));
    }
  }
}

// SGD streams its momentum through NVMe like AdamW's moments (pieces of 48 floats, which cut
// the tensors): the same parameters as in memory, bit for bit. LARS and Lamb are refused there.
TEST_CASE("SGD with offload_optimizer nvme equals it in memory, LARS and Lamb refuse NVMe",
          "[optimizers]") {
  const nlohmann::json ref = optest::reference();
  for (const auto& c : ref.at("configs")) {
    float gm = 1.f;
    const OptimizerParams p = optest::params_of(c, &gm);
    swtest::TempDir dir("optimizers_nvme");
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    pol.offload_optimizer.device = OffloadDevice::Nvme;
    pol.offload_optimizer.nvme_path = dir.path.string();
    pol.offload_optimizer.piece_floats = 48;
    Model m = optest::make_model();
    ShardedModel sm(m, ops_for(Device::cpu()), 1, make_local_group(), pol);
    if (p.per_tensor()) {
      CHECK_THROWS_WITH(optest::run(sm, p, gm, 1, {}), Catch::Contains("NVMe"));
      continue;
    }
    INFO(c.at("name").get<std::string>());
    Model m1 = optest::make_model();
    ShardedModel one(m1, ops_for(Device::cpu()), 1);
    const auto want = optest::run(one, p, gm, 20, {20}).at(20);
    const auto got = optest::run(sm, p, gm, 20, {20}).at(20);
    CHECK(got == want);
  }
}

namespace {

ModelConfig tiny() {
  ModelConfig cfg;
  cfg.type = "gpt2";
  cfg.vocab_size = 64;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.d_model = 32;
  cfg.seq_len = 16;
  return cfg;
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
};

// Ten steps of a tiny GPT-2 with the optimizer `p`, clipping at norm 1.
Run train_gpt(const Ops& ops, const ShardingPolicy& pol, const OptimizerParams& p) {
  const ModelConfig cfg = tiny();
  Model m = build_model(cfg);
  ShardedModel sm(m, ops, 1234, make_local_group(), pol);
  std::vector<int32_t> tok(size_t(2) * cfg.seq_len), tgt(tok.size());
  Rng r(5);
  for (auto& t : tok) t = int32_t(r.below(uint64_t(cfg.vocab_size)));
  for (auto& t : tgt) t = int32_t(r.below(uint64_t(cfg.vocab_size)));
  const Batch b{tok.data(), tgt.data(), 2, cfg.seq_len};
  Run out;
  for (int step = 1; step <= 10; ++step) {
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

std::vector<std::pair<std::string, OptimizerParams>> gpt_optimizers() {
  OptimizerParams sgd, lars, lamb;
  sgd.type = OptimizerType::SGD, sgd.lr = 0.1f, sgd.momentum = 0.9f, sgd.nesterov = true;
  sgd.weight_decay = 0.01f;
  lars.type = OptimizerType::LARS, lars.lr = 1.f, lars.momentum = 0.9f;
  lars.weight_decay = 1e-3f, lars.trust_coefficient = 0.01f;
  lamb.type = OptimizerType::Lamb, lamb.lr = 0.01f, lamb.beta2 = 0.999f, lamb.weight_decay = 0.01f;
  return {{"SGD", sgd}, {"LARS", lars}, {"Lamb", lamb}};
}

}  // namespace

TEST_CASE("optimizers on a device with offload_optimizer cpu train as on the CPU",
          "[optimizers]") {
  for (const auto& [name, p] : gpt_optimizers()) {
    INFO(name);
    ShardingPolicy cpu_pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    const Run want = train_gpt(ops_for(Device::cpu()), cpu_pol, p);
    ShardingPolicy off = cpu_pol;
    off.offload_optimizer.device = OffloadDevice::Cpu;
    const Run got = train_gpt(ops_for(Device::sim(0)), off, p);
    REQUIRE(got.losses.size() == want.losses.size());
    CHECK(want.losses.back() < want.losses.front());  // (it trains)
    for (size_t i = 0; i < want.losses.size(); ++i)
      CHECK(got.losses[i] == Approx(want.losses[i]).epsilon(1e-6));
    double worst = 0;
    for (const auto& [tn, v] : want.params) {
      const auto& g = got.params.at(tn);
      for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, double(std::fabs(v[i] - g[i])));
    }
    CHECK(worst <= 1e-6);
    CHECK(swtest::sim_device_bytes_in_use() == 0);
  }
}

// bf16 parameters at one rank on the device (a split master beside 16-bit parameters: AdamW
// writes the compute copies in its pass; the others update the master, then re-round the copy):
// as the CPU's bf16 run, whose copies come from the master the same way.
TEST_CASE("optimizers with bf16 parameters on a device train as on the CPU", "[optimizers]") {
  for (const auto& [name, p] : gpt_optimizers()) {
    INFO(name);
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    pol.mixed_precision.param_dtype = DType::BF16;
    const Run want = train_gpt(ops_for(Device::cpu()), pol, p);
    const Run got = train_gpt(ops_for(Device::sim(0)), pol, p);
    REQUIRE(got.losses.size() == want.losses.size());
    CHECK(want.losses.back() < want.losses.front());
    for (size_t i = 0; i < want.losses.size(); ++i)
      CHECK(got.losses[i] == Approx(want.losses[i]).epsilon(1e-3));
    double worst = 0;
    for (const auto& [tn, v] : want.params) {
      const auto& g = got.params.at(tn);
      for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, double(std::fabs(v[i] - g[i])));
    }
    CHECK(worst <= 1e-6);  // (observed: 0, the simulated device computing as the CPU)
  }
}
