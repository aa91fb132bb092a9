// A training config as the planner sees it: the one conversion from TrainConfig to the
// planner's input (planner/search.h PlanSetup), used by train() to resolve "auto" keys and by
// `shardwise plan`, so that the plan one prints is the plan the other would search from. The
// budget both search within is read by one parser (core/bytes.h parse_budget_bytes: a config's
// memory_budget, `shardwise plan --memory-budget`).
#pragma once
#include "engine/config.h"
#include "planner/search.h"

namespace sw {

// The shard group HYBRID_SHARD forms when shard_group_size is 0: the ranks on one node
// (`ranks_per_node`, the launcher's local size) when they divide the world, else the whole
// world (FSDP's default: shard within a node, replicate across nodes). ranks_per_node 0 = not
// known (then the whole world).
int default_shard_group(int world, int ranks_per_node);

// What a run of `cfg` on `world` ranks is planned from: the model, the sharding policy with
// HYBRID_SHARD's group resolved as the trainer resolves it (default_shard_group with the
// launcher's ranks per node; outside a launcher the whole world), blocks per unit, micro batch
// and accumulation, whether the model lives on a device, and data_bytes, the token files'
// sizes (data.train and data.val are mapped whole: part of the resident set).
PlanSetup plan_setup(const TrainConfig& cfg, int world);

// The search train() runs for the "auto" keys of `cfg` on `world` ranks: plan_setup's input,
// within memory_budget, varying only what is "auto" (every other key as configured).
struct AutoSearch {
  PlanSetup base;
  SearchOptions options;
};
AutoSearch auto_search(const TrainConfig& cfg, int world);

// Pipeline parallelism: the stage bounds of `whole` (a tensor rank's model after wrap_blocks;
// Model::stage): parallelism.pipeline_parallel_split_points, or stages of consecutive
// positions balanced by the time model's flops per position (forward + backward of the
// micro-batch). Throws sw::Error naming the key when the stages cannot be formed.
std::vector<int> pipeline_bounds(const TrainConfig& cfg, const Model& whole);

}  // namespace sw
