#include "sharding/policy.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sw {

namespace {
constexpr ShardingStrategy kAll[] = {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                                     ShardingStrategy::ShardOptimizer, ShardingStrategy::NoShard,
                                     ShardingStrategy::HybridShard};
}

const char* strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FullShard:
      return "FULL_SHARD";
    case ShardingStrategy::ShardGradOp:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::ShardOptimizer:
      return "SHARD_OPTIMIZER";
    case ShardingStrategy::NoShard:
      return "NO_SHARD";
    case ShardingStrategy::HybridShard:
      return "HYBRID_SHARD";
  }
  return "?";
}

ShardingStrategy strategy_from_name(const std::string& name) {
  for (ShardingStrategy s : kAll)
    if (name == strategy_name(s)) return s;
  fail("sharding",
       "unknown sharding strategy '" + name +
           "' (expected FULL_SHARD, SHARD_GRAD_OP, SHARD_OPTIMIZER, NO_SHARD or HYBRID_SHARD)");
}

ShardingStrategy strategy_from_stage(int stage) {
  switch (stage) {
    case 3:
      return ShardingStrategy::FullShard;
    case 2:
      return ShardingStrategy::ShardGradOp;
    case 1:
      return ShardingStrategy::ShardOptimizer;
    case 0:
      return ShardingStrategy::NoShard;
  }
  fail("sharding", "ZeRO stage must be 0, 1, 2 or 3, got " + std::to_string(stage));
}

int stage_of(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FullShard:
      return 3;
    case ShardingStrategy::ShardGradOp:
      return 2;
    case ShardingStrategy::ShardOptimizer:
      return 1;
    case ShardingStrategy::NoShard:
      return 0;
    case ShardingStrategy::HybridShard:
      return 3;
  }
  return 3;
}

const char* accum_mode_name(GradAccumMode m) {
  return m == GradAccumMode::ReduceOnce ? "reduce_once" : "reduce_each_micro_step";
}

GradAccumMode accum_mode_from_name(const std::string& name) {
  if (name == "reduce_each_micro_step") return GradAccumMode::ReduceEachMicroStep;
  if (name == "reduce_once") return GradAccumMode::ReduceOnce;
  fail("sharding", "unknown gradient accumulation mode '" + name +
                       "' (expected reduce_each_micro_step or reduce_once)");
}

GradAccumMode default_accum_mode(ShardingStrategy s) {
  return s == ShardingStrategy::NoShard || s == ShardingStrategy::ShardOptimizer
             ? GradAccumMode::ReduceOnce
             : GradAccumMode::ReduceEachMicroStep;
}

bool default_reshard_after_forward(ShardingStrategy s) {
  return s == ShardingStrategy::FullShard || s == ShardingStrategy::HybridShard;
}

ShardingPolicy ShardingPolicy::for_strategy(ShardingStrategy s) {
  ShardingPolicy p;
  p.strategy = s;
  p.reshard_after_forward = default_reshard_after_forward(s);
  p.accum = default_accum_mode(s);
  return p;
}

std::string ShardingPolicy::describe() const {
  std::string d = strategy_name(strategy);
  d += "(reshard_after_forward=" + std::to_string(reshard_after_forward ? 1 : 0);
  d += ", prefetch=" + std::to_string(forward_prefetch) + "/" + std::to_string(backward_prefetch);
  d += ", max_live_units=" + std::to_string(max_live_units);
  d += std::string(", accum=") + accum_mode_name(accum);
  if (strategy == ShardingStrategy::HybridShard)
    d += ", shard_group_size=" + std::to_string(shard_group_size);
  if (strategy == ShardingStrategy::NoShard) d += ", bucket_bytes=" + std::to_string(bucket_bytes);
  return d + ")";
}

const char* checkpoint_mode_name(CheckpointMode m) {
  switch (m) {
    case CheckpointMode::Off: return "off";
    case CheckpointMode::Full: return "full";
    case CheckpointMode::Selective: return "selective";
  }
  return "?";
}

CheckpointMode checkpoint_mode_from_name(const std::string& s) {
  if (s == "off") return CheckpointMode::Off;
  if (s == "full") return CheckpointMode::Full;
  if (s == "selective") return CheckpointMode::Selective;
  fail("sharding", "activation checkpointing mode '" + s + "': expected off, full or selective");
}

CheckpointMode ActivationCheckpointing::mode_for(int index) const {
  if (mode == CheckpointMode::Off) return mode;
  if (!units.empty())
    return std::find(units.begin(), units.end(), index) != units.end() ? mode
                                                                         : CheckpointMode::Off;
  return every > 0 && index % every == 0 ? mode : CheckpointMode::Off;
}

const char* offload_device_name(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::None:
      return "none";
    case OffloadDevice::Cpu:
      return "cpu";
    case OffloadDevice::Nvme:
      return "nvme";
  }
  return "?";
}

bool OptimizerOffload::offloaded(int index, int units) const {
  if (device == OffloadDevice::None) return false;
  const int n = static_cast<int>(std::ceil(ratio * units - 1e-9));
  return index < n;
}

bool ParamOffload::on_nvme(int u, const std::vector<int64_t>& shard_floats) const {
  if (device != OffloadDevice::Nvme) return false;
  int64_t kept = 0;
  for (int k = 0; k <= u; ++k) {
    kept += shard_floats[size_t(k)];
    if (kept > max_in_cpu) return true;  // unit k and every later one go to the file
  }
  return false;
}

}  // namespace sw
