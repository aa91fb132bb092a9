// validate_config (engine/config.h): a TrainConfig built in code gets the checks a config file
// gets, with the same messages, without a trip through JSON; the short forms code may use
// resolve to what reading their resolved config would give.
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/config.h"
#include "engine_test_util.h"

using namespace sw;
using Catch::Matchers::Contains;

namespace {

// What validate_config says about `c`: "(no error)" or the message.
std::string validation_error(TrainConfig c) {
  try {
    validate_config(c, 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// What reading `c`'s resolved config says: the way train() checked a config before.
std::string reread_error(const TrainConfig& c) {
  try {
    parse_config(config_json(c), c.source.empty() ? "TrainConfig" : c.source, {}, 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("validate_config: a config built in code is checked as its resolved file would be") {
  const std::vector<std::pair<std::string, std::function<void(TrainConfig&)>>> cases = {
      {"defaults", [](TrainConfig&) {}},
      {"lr", [](TrainConfig& c) { c.optimizer.lr = -1; }},
      {"betas", [](TrainConfig& c) { c.optimizer.beta2 = 1.0f; }},
      {"micro batch", [](TrainConfig& c) { c.micro_batch = 0; }},
      {"rows", [](TrainConfig& c) { c.micro_batch = 1 << 30, c.grad_accum = 4; }},
      {"scheduler", [](TrainConfig& c) { c.scheduler.type = "OneCycle"; }},
      {"warm-up", [](TrainConfig& c) { c.scheduler.warmup_num_steps = 500; }},
      {"bf16 and fp16", [](TrainConfig& c) { c.bf16 = c.fp16 = true; }},
      {"fp16 policy", [](TrainConfig& c) { c.sharding.mixed_precision.param_dtype = DType::F16; }},
      {"heads", [](TrainConfig& c) { c.model.d_model = 100, c.model.n_head = 3; }},
      {"vocab", [](TrainConfig& c) { c.model.vocab_size = 70000; }},
      {"device", [](TrainConfig& c) { c.device = "gpu"; }},
      {"run_dir", [](TrainConfig& c) { c.run_dir = ""; }},
      {"resume", [](TrainConfig& c) {
         c.checkpoint.resume = "auto";
         c.checkpoint.init_from = std::string(1, 'w');  // (GCC 12's -Wrestrict misfires on = "w")
       }},
      {"profile", [](TrainConfig& c) { c.profile.enabled = true, c.profile.start_step = 200; }},
      {"auto", [](TrainConfig& c) { c.autoplan.blocks = true; }},
      {"hybrid", [](TrainConfig& c) {
         c.sharding = ShardingPolicy::for_strategy(ShardingStrategy::HybridShard);
         c.sharding.shard_group_size = 3;
       }},
      {"ratio", [](TrainConfig& c) { c.sharding.offload_optimizer.ratio = 2; }},
      {"nvme", [](TrainConfig& c) { c.sharding.offload_optimizer.device = OffloadDevice::Nvme; }},
      {"nvme params", [](TrainConfig& c) {
         c.zero_stage = 1;
         c.sharding.offload_param.device = OffloadDevice::Nvme;
         c.sharding.offload_param.nvme_path = "/tmp/p";
       }},
      {"units", [](TrainConfig& c) {
         c.sharding.activation_checkpointing.mode = CheckpointMode::Full;
         c.sharding.activation_checkpointing.units = {0, 9};
       }},
      {"prefetch", [](TrainConfig& c) { c.sharding.forward_prefetch = 2000; }},
      {"aio", [](TrainConfig& c) { c.sharding.aio.block_size = 5000; }},
      {"source", [](TrainConfig& c) { c.source = "mine.json", c.optimizer.eps = 0; }},
  };
  for (const auto& [name, change] : cases) {
    INFO(name);
    TrainConfig c;
    change(c);
    CHECK(validation_error(c) == reread_error(c));
  }
  // The message names the source and the key, as a file's does.
  TrainConfig c;
  c.optimizer.lr = -1;
  CHECK(validation_error(c) == "config: TrainConfig: optimizer.params.lr: must be > 0 (got -1)");
  // A stage out of range is named before it selects a strategy.
  TrainConfig s;
  s.zero_stage = 5;
  CHECK(validation_error(s) == "config: TrainConfig: zero_optimization.stage: must be in [0, 3] "
                               "(got 5)");
}

TEST_CASE("validate_config: the short forms of code resolve as their resolved config reads") {
  TrainConfig c;
  c.zero_stage = 2;
  c.bf16 = true;
  c.run_dir = "runs/code";
  TrainConfig v = c;
  validate_config(v, 1);
  const TrainConfig r = parse_config(config_json(c), "TrainConfig", {}, 1);
  CHECK(v.sharding.strategy == ShardingStrategy::ShardGradOp);
  CHECK_FALSE(v.sharding.reshard_after_forward);
  CHECK(v.sharding.mixed_precision.param_dtype == DType::BF16);
  CHECK(v.checkpoint.dir == "runs/code/checkpoints");
  CHECK(v.profile.out == "runs/code/profile");
  CHECK(v.source == "TrainConfig");
  CHECK(v.sharding.describe() == r.sharding.describe());
  CHECK(config_json(v) == config_json(r));
  // A config read from a file passes unchanged.
  const TrainConfig f = enginetest::parse(R"({"sharding_strategy": "HYBRID_SHARD",
      "activation_checkpointing": {"mode": "full", "units": [1, 2]}, "fp16": {"enabled": true}})");
  TrainConfig g = f;
  validate_config(g, 1);
  CHECK(config_json(g) == config_json(f));
  CHECK(g.sharding.describe() == f.sharding.describe());
}

TEST_CASE("validate_config: the policy's own checks are the config's, one line naming the key") {
  TrainConfig c;
  c.sharding.activation_checkpointing.offload_nvme = true;
  CHECK_THAT(validation_error(c),
             Contains("config: TrainConfig: activation_checkpointing.nvme_path: required with "
                      "offload 'nvme'"));
  // sharding/policy.h validate, for policies that come from elsewhere.
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::HybridShard);
  p.shard_group_size = 3;
  CHECK_THROWS_WITH(validate(p, 4), "sharding: shard_group_size: must divide the world size (4), "
                                    "got 3");
  CHECK_NOTHROW(validate(p));  // the world not known
  p.shard_group_size = 2;
  p.activation_checkpointing.units = {0, 5};
  CHECK_THROWS_WITH(validate(p, 4, 3), "sharding: activation_checkpointing.units[1]: must be in "
                                       "[0, 2]: the model has 3 units (got 5)");
  p.activation_checkpointing.units = {1, 1};
  CHECK_THROWS_WITH(validate(p, 4, 3),
                    "sharding: activation_checkpointing.units[1]: unit 1 is listed twice");
}
