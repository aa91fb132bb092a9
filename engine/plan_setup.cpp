// A training config as the planner sees it (plan_setup.h).
#include "engine/plan_setup.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/launch.h"
#include "engine/data.h"
#include "planner/pipeline.h"
#include "sharding/pipeline_schedule.h"

namespace sw {

int default_shard_group(int world, int ranks_per_node) {
  return ranks_per_node > 0 && world % ranks_per_node == 0 ? ranks_per_node : world;
}

PlanSetup plan_setup(const TrainConfig& cfg, int world) {
  PlanSetup s;
  s.model = cfg.model;
  s.policy = cfg.sharding;
  s.world = world;
  s.tensor = std::max(1, cfg.parallelism.tensor);
  // HYBRID's default group within the data-parallel ranks, as the trainer makes it (the ranks
  // per node over the tensor degree).
  const int local = launch_env().local_size;
  if (local > 0 && world % local == 0) s.hosts = world / local;
  if (s.policy.strategy == ShardingStrategy::HybridShard && s.policy.shard_group_size == 0)
    s.policy.shard_group_size =
        default_shard_group(s.data_world(), local > 0 ? std::max(1, local / s.tensor) : 0);
  s.pipeline = std::max(1, cfg.parallelism.pipeline);
  if (s.pipeline > 1) {
    s.pipe_chunks = cfg.parallelism.stages_per_rank();
    s.pipe_schedule = static_cast<int>(pipe_schedule_from_name(cfg.parallelism.schedule));
    s.split_points = cfg.parallelism.split_points;
  }
  s.blocks_per_unit = cfg.blocks_per_unit;
  s.micro_batch = cfg.micro_batch;
  s.accum = cfg.grad_accum;
  s.on_device = cfg.device != "cpu";
  s.threads = cfg.threads;
  s.checkpoint_saves = cfg.checkpoint.every_steps > 0;
  s.checkpoint_async = cfg.checkpoint.async;
  // Resident (RSS): every token file of data.train / data.val (a file, directory or glob) and
  // the mask files beside them. A spec that names nothing counts 0 (the trainer reports it).
  for (const std::string& spec : {cfg.train_data, cfg.val_data}) {
    if (spec.empty()) continue;
    std::vector<std::string> files;
    try {
      files = resolve_token_files(spec);
    } catch (const Error&) {
      continue;
    }
    for (const std::string& f : files)
      for (const std::string& p : {f, mask_path_for(f)}) {
        std::error_code ec;
        if (const auto n = std::filesystem::file_size(p, ec); !ec) s.data_bytes += int64_t(n);
      }
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
  a.options.free.tensor = ap.tensor;
  if (ap.tensor) {  // the degree the search chooses; the global batch is kept
    a.base.tensor = 1;
    a.base.micro_batch = cfg.micro_batch;
  }
  return a;
}

std::vector<int> pipeline_bounds(const TrainConfig& cfg, const Model& whole) {
  const ParallelismConfig& pp = cfg.parallelism;
  const int S = pp.pipeline * pp.stages_per_rank();
  const int P = static_cast<int>(whole.schedule.size());
  const std::string at = cfg.source.empty() ? "" : cfg.source + ": ";
  if (S > P)
    fail("config", at + "parallelism.pipeline_parallel_degree: " + std::to_string(S) +
                       " stages need as many schedule positions; the model has " +
                       std::to_string(P) + " (the embedding, " + std::to_string(P - 2) +
                       " units' calls, the loss)");
  if (!pp.split_points.empty()) {
    std::vector<int> b{0};
    for (int x : pp.split_points) b.push_back(x);
    b.push_back(P);
    if (pp.split_points.back() >= P)
      fail("config", at + "parallelism.pipeline_parallel_split_points: position " +
                         std::to_string(pp.split_points.back()) + " is not before the last (" +
                         std::to_string(P - 1) + ", the loss)");
    return b;
  }
  return balanced_stage_bounds(whole, cfg.micro_batch, cfg.model.seq_len, S);
}

}  // namespace sw
