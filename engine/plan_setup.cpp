// A training config as the planner sees it (plan_setup.h).
#include "engine/plan_setup.h"

#include <filesystem>

#include "core/launch.h"

namespace sw {

int default_shard_group(int world, int ranks_per_node) {
  return ranks_per_node > 0 && world % ranks_per_node == 0 ? ranks_per_node : world;
}

PlanSetup plan_setup(const TrainConfig& cfg, int world) {
  PlanSetup s;
  s.model = cfg.model;
  s.policy = cfg.sharding;
  if (s.policy.strategy == ShardingStrategy::HybridShard && s.policy.shard_group_size == 0)
    s.policy.shard_group_size = default_shard_group(world, launch_env().local_size);
  s.world = world;
  s.blocks_per_unit = cfg.blocks_per_unit;
  s.micro_batch = cfg.micro_batch;
  s.accum = cfg.grad_accum;
  s.on_device = cfg.device != "cpu";
  s.threads = cfg.threads;
  for (const std::string& f : {cfg.train_data, cfg.val_data}) {  // resident: RSS
    std::error_code ec;
    if (const auto n = f.empty() ? 0 : std::filesystem::file_size(f, ec); !ec)
      s.data_bytes += int64_t(n);
  }
  return s;
}

AutoSearch auto_search(const TrainConfig& cfg, int world) {
  AutoSearch a;
  a.base = plan_setup(cfg, world);
  a.options.budget = static_cast<int64_t>(cfg.memory_budget);
  const TrainConfig::AutoPlan& ap = cfg.autoplan;
  a.options.free = SearchFree{ap.blocks,          false, false, ap.checkpointing,
                              ap.offload_optimizer, ap.offload_param, false, false};
  return a;
}

}  // namespace sw
