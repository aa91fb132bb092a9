#include "sharding/policy.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.h"
#include "kernels/ops.h"

namespace sw {

bool MixedPrecisionPolicy::weights16(bool on_device) const {
  return param_dtype != DType::F32 &&
         (on_device || products_read_weights16(Device::cpu(), param_dtype));
}

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
  if (release_grads) d += ", release_grads=1";
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

namespace {

[[noreturn]] void bad_policy(const std::string& key, const std::string& problem) {
  fail("sharding", key + ": " + problem);
}

std::string shortest(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

void at_least(const std::string& key, int64_t x, int64_t lo) {
  if (x < lo)
    bad_policy(key, "must be >= " + std::to_string(lo) + " (got " + std::to_string(x) + ")");
}

}  // namespace

void validate(const ShardingPolicy& p, int world, int units) {
  const MixedPrecisionPolicy& mp = p.mixed_precision;
  for (const auto& [key, d] : {std::pair{"mixed_precision.param_dtype", mp.param_dtype},
                               std::pair{"mixed_precision.reduce_dtype", mp.reduce_dtype}})
    if (d != DType::F32 && d != DType::BF16 && d != DType::F16)
      bad_policy(key, std::string("unsupported dtype ") + dtype_name(d) +
                          " (fp32, bf16 or fp16)");
  if (mp.fp8 && mp.param_dtype != DType::BF16)
    bad_policy("fp8.enabled", "needs bf16 mixed precision (param_dtype bf16)");
  if (mp.fp8_delayed) at_least("fp8.amax_history", mp.fp8_amax_history, 1);
  if (mp.fp8_all_gather && !mp.fp8) bad_policy("fp8.all_gather", "needs fp8.enabled");
  if (mp.fp8_all_gather && mp.fp8_delayed)
    bad_policy("fp8.all_gather", "needs the current recipe (a gathered weight's scale is its "
                                 "amax now), not delayed");
  if (mp.fp8_all_gather && p.quantized.weights)
    bad_policy("fp8.all_gather", "and zero_quantized_weights both compress the gather; choose one");
  at_least("forward_prefetch", p.forward_prefetch, 0);
  at_least("backward_prefetch", p.backward_prefetch, 0);
  at_least("max_live_units", p.max_live_units, 0);
  if (p.strategy == ShardingStrategy::HybridShard) {
    at_least("shard_group_size", p.shard_group_size, 0);
    if (world > 0 && p.shard_group_size > 0 && world % p.shard_group_size != 0)
      bad_policy("shard_group_size", "must divide the world size (" + std::to_string(world) +
                                         "), got " + std::to_string(p.shard_group_size));
  }
  const OptimizerOffload& oo = p.offload_optimizer;
  if (!(oo.ratio >= 0 && oo.ratio <= 1))
    bad_policy("zero_optimization.offload_optimizer.ratio",
               "must be [0, 1] (got " + shortest(oo.ratio) + ")");
  at_least("zero_optimization.offload_optimizer.buffer_count", oo.buffer_count, 2);
  if (oo.device == OffloadDevice::Nvme && oo.nvme_path.empty())
    bad_policy("zero_optimization.offload_optimizer.nvme_path",
               "required with device 'nvme' (a directory on a local disk)");
  const ParamOffload& po = p.offload_param;
  at_least("zero_optimization.offload_param.buffer_count", po.buffer_count, 2);
  at_least("zero_optimization.offload_param.max_in_cpu", po.max_in_cpu, 0);
  if (po.device == OffloadDevice::Nvme) {
    if (po.nvme_path.empty())
      bad_policy("zero_optimization.offload_param.nvme_path",
                 "required with device 'nvme' (a directory on a local disk)");
    if (p.strategy != ShardingStrategy::FullShard && p.strategy != ShardingStrategy::ShardGradOp &&
        p.strategy != ShardingStrategy::HybridShard)
      bad_policy("zero_optimization.offload_param.device",
                 std::string("'nvme' needs a strategy that shards parameters (FULL_SHARD, "
                             "SHARD_GRAD_OP or HYBRID_SHARD), not ") +
                     strategy_name(p.strategy));
  }
  const ActivationCheckpointing& ac = p.activation_checkpointing;
  at_least("activation_checkpointing.every", ac.every, 1);
  for (size_t i = 0; i < ac.units.size(); ++i) {
    const std::string key = "activation_checkpointing.units[" + std::to_string(i) + "]";
    const int u = ac.units[i];
    if (units > 0 && (u < 0 || u >= units))
      bad_policy(key, "must be in [0, " + std::to_string(units - 1) + "]: the model has " +
                          std::to_string(units) + " units (got " + std::to_string(u) + ")");
    at_least(key, u, 0);
    if (std::find(ac.units.begin(), ac.units.begin() + static_cast<std::ptrdiff_t>(i), u) !=
        ac.units.begin() + static_cast<std::ptrdiff_t>(i))
      bad_policy(key, "unit " + std::to_string(u) + " is listed twice");
  }
  if (ac.offload_cpu && ac.offload_nvme)
    bad_policy("activation_checkpointing.offload", "cpu and nvme at once; choose one");
  if (ac.offload_nvme && ac.nvme_path.empty())
    bad_policy("activation_checkpointing.nvme_path",
               "required with offload 'nvme' (a directory on a local disk; zero_optimization's "
               "offload nvme_path is used when set)");
  const CommQuantization& q = p.quantized;
  if (q.bits != 8 && q.bits != 4)
    bad_policy("zero_optimization.quantized_bits",
               "must be 8 or 4 (got " + std::to_string(q.bits) + ")");
  at_least("zero_optimization.quantized_block_size", q.block, int64_t{1});
  if (q.any() && p.strategy == ShardingStrategy::NoShard)
    bad_policy(q.gradients ? "zero_optimization.zero_quantized_gradients"
                           : "zero_optimization.zero_quantized_weights",
               "needs a strategy that shards (NO_SHARD's bucket all-reduce is not quantised)");
  if (q.gradients && mp.reduce_dtype != DType::F32)
    bad_policy("zero_optimization.zero_quantized_gradients",
               std::string("needs reduce_dtype fp32 (the quantised reduction replaces the ") +
                   dtype_name(mp.reduce_dtype) + " one; it sums in fp32)");
}

}  // namespace sw
