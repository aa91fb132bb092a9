// How a ShardedModel splits model state over ranks: a small value type the engine fills from
// the JSON config (engine/config_schema.cpp) and ShardedModel reads; validate() checks it.
// FSDP's names, DeepSpeed's stages:
//
//   strategy         stage  parameters between uses   gradients                  optimizer state
//   FULL_SHARD       3      shard; gathered per unit  reduce-scattered to shards  shard
//                           for fwd and again for bwd
//   SHARD_GRAD_OP    2      shard; gathered in fwd,   reduce-scattered to shards  shard
//                           kept until the unit's bwd
//   SHARD_OPTIMIZER  1      full on every rank;       full, reduce-scattered      shard; updated
//                           all-gathered after step   once per step               slices gathered
//   NO_SHARD         0      full on every rank        full, bucketed all-reduce   full (DDP)
//   HYBRID_SHARD     -      FULL_SHARD inside groups of shard_group_size ranks; the gradient
//                           shards are then all-reduced across the groups (replicas)
//
// Gradient accumulation (gradient_accumulation_steps > 1), `accum`:
//   ReduceEachMicroStep  every micro-step's gradients are reduced right after its backward and
//                        added into the sharded gradients; the unsharded gradient buffer of a
//                        unit lives only from its backward to its reduce-scatter (low memory;
//                        default for stages 2, 3 and HYBRID).
//   ReduceOnce           unsharded gradients accumulate locally over the micro-steps and are
//                        reduced during the last micro-step's backward (1/accum of the
//                        communication; every unit's unsharded gradients stay allocated across
//                        the micro-steps; default for stages 0 and 1, which keep full
//                        gradients anyway).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "models/recompute.h"
#include "offload/aio_config.h"
#include "sharding/comm/device_comm.h"

namespace sw {

enum class ShardingStrategy : uint8_t {
  FullShard,
  ShardGradOp,
  ShardOptimizer,
  NoShard,
  HybridShard
};
enum class GradAccumMode : uint8_t { ReduceEachMicroStep, ReduceOnce };

// "FULL_SHARD", "SHARD_GRAD_OP", "SHARD_OPTIMIZER", "NO_SHARD", "HYBRID_SHARD".
const char* strategy_name(ShardingStrategy s);
// Inverse of strategy_name; throws sw::Error("sharding: ...") listing the valid names.
ShardingStrategy strategy_from_name(const std::string& name);
// zero_optimization.stage -> strategy (3 FULL_SHARD, 2 SHARD_GRAD_OP, 1 SHARD_OPTIMIZER,
// 0 NO_SHARD); and back (HYBRID_SHARD shards like stage 3).
ShardingStrategy strategy_from_stage(int stage);
int stage_of(ShardingStrategy s);
// "reduce_each_micro_step", "reduce_once"; and back (throws sw::Error).
const char* accum_mode_name(GradAccumMode m);
GradAccumMode accum_mode_from_name(const std::string& name);
GradAccumMode default_accum_mode(ShardingStrategy s);
// The strategy's default for reshard_after_forward (FULL_SHARD, HYBRID_SHARD: true).
bool default_reshard_after_forward(ShardingStrategy s);

// Mixed precision (FSDP's MixedPrecision, DeepSpeed's bf16/fp16 blocks). Master weights and
// optimizer state stay fp32 in the shards. param_dtype: parameters are all-gathered in this
// type (half the bytes of f32) and units compute with ops_for(device, param_dtype);
// reduce_dtype: gradients are reduce-scattered / all-reduced in this type.
struct MixedPrecisionPolicy {
  DType param_dtype = DType::F32;
  DType reduce_dtype = DType::F32;
  bool enabled() const { return param_dtype != DType::F32 || reduce_dtype != DType::F32; }
  // Whether each unit keeps a 16-bit copy of its gathered parameters beside the fp32 ones, so
  // that the matrix products read the weights without narrowing them on each call
  // (sharding/unit_state.h): a 16-bit param_dtype where the backend's products read 16-bit
  // weights (products_read_weights16, kernels/ops.h): on a device, and on the CPU where its
  // bf16 products run on oneDNN (the other CPU paths round fp32 while packing: none kept).
  bool weights16(bool on_device) const;
  // FP8 linears (the config's "fp8" block; kernels/fp8_ops.h): units compute with an Fp8Ops
  // around the bf16 Ops, so the blocks' Linear products run E4M3 / E5M2 with per-tensor scales
  // (current, or delayed over fp8_amax_history calls). Needs param_dtype BF16.
  bool fp8 = false;
  bool fp8_delayed = false;
  int fp8_amax_history = 16;
  // fp8.round_scales_to_power_of_2: every fp8 scale a power of two (kernels/fp8_ops.h).
  bool fp8_pow2 = false;
  // fp8.all_gather (torchtitan's enable_fsdp_float8_all_gather): a sharded unit gathers its
  // products' weights as E4M3 bytes with one power-of-two scale per tensor (the amax of the
  // whole tensor, one small all-reduce per gather), the other parameters bf16: about half the
  // bytes of the bf16 gather, and the same values the fp8 products would quantise the weights
  // to (sharding/unit_state.h). Needs the current recipe; implies fp8_pow2.
  bool fp8_all_gather = false;
  bool fp8_pow2_scales() const { return fp8_pow2 || fp8_all_gather; }
};

// Activation checkpointing: which units drop their saved activations after forward and
// recompute them inside their backward. Full: the unit keeps only its input; Selective: it
// keeps the outputs of its matrix products (and attention) and recomputes only the cheap
// element-wise ops (norm and activation outputs). Units: every `every`-th unit counting
// from 0 (every = 1: all), or exactly the unit indices in `units` when that is not empty.
// A loss call is never recomputed.
const char* checkpoint_mode_name(CheckpointMode m);  // "off", "full", "selective"
CheckpointMode checkpoint_mode_from_name(const std::string& s);  // throws sw::Error
struct ActivationCheckpointing {
  CheckpointMode mode = CheckpointMode::Off;
  int every = 1;
  std::vector<int> units;
  // activation_checkpointing.offload: "cpu" moves what a call keeps for its backward (its input
  // and its Saved, after any checkpointing drop) to the host tier after the call's forward and
  // back right before its backward: the alternative to recomputation. Every call but the
  // first, the loss and the one right before it (backward needs it at once).
  bool offload_cpu = false;
  // "nvme": the same, to a file per rank (<nvme_path>/rank_<r>/activations.bin): each call's
  // kept input and Saved are written after its forward (freed once written) and read back one
  // call ahead of its backward, overlapping the backward of the call after it.
  bool offload_nvme = false;
  std::string nvme_path;
  bool offloads() const { return offload_cpu || offload_nvme; }
  // The mode that applies to unit `index` (Off when the unit is not selected).
  CheckpointMode mode_for(int index) const;
};

// zero_optimization.offload_optimizer (DeepSpeed's key): where the AdamW moments of the
// offloaded units live. Cpu: the host tier (core/alloc.h Tier::Host): outside the device's
// memory_budget; on the CPU backend the update reads them in place, on a GPU the host runs the
// CPU AdamW on them. `ratio`: the fraction of units offloaded, the first ceil(ratio * units)
// in unit order. Nvme: a file per rank, read ahead and written behind the update.
enum class OffloadDevice : uint8_t { None, Cpu, Nvme };
const char* offload_device_name(OffloadDevice d);  // "none", "cpu", "nvme"
struct OptimizerOffload {
  OffloadDevice device = OffloadDevice::None;
  double ratio = 1.0;
  // Nvme: the moments live in <nvme_path>/rank_<r>/optimizer.bin (created at start, removed at
  // a clean exit) and stream through `buffer_count` staging buffers during the update.
  std::string nvme_path;
  int buffer_count = 4;
  // Floats of a unit's shard per staged piece (m and v: 32 MiB of staging at the default), so
  // staging does not grow with the largest unit. Not a config key; tests make it small.
  int64_t piece_floats = int64_t{1} << 22;
  int64_t piece() const { return piece_floats < 16 ? 16 : piece_floats; }  // what is used
  // Nvme (zero_optimization.offload_optimizer.defer_update, default true): a unit whose
  // moments alone are on NVMe (its master in memory, strategies other than SHARD_OPTIMIZER) is
  // updated at the start of the next step's first forward, just before the unit's first use,
  // so that its moments' reads and write-backs overlap that forward's compute instead of
  // waiting at the end of the step; any access to the state in between (evaluation,
  // checkpoints, export) applies the update first. Bit-identical either way.
  bool defer_update = true;
  // Whether unit `index` of `units` has its optimizer state offloaded.
  bool offloaded(int index, int units) const;
};

// zero_optimization.offload_param (DeepSpeed's key; stage 3 only): where every unit's fp32
// master shard and its reduced gradient shard live (gradients follow their parameters). Cpu:
// the host tier, outside the device's memory_budget; the device then holds only gathered
// parameters, unsharded gradients in flight and activations. Nvme (sharded strategies:
// FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD; even at one rank): both shards
// live in <nvme_path>/rank_<r>/params.bin; a unit's master shard is read into one of
// `buffer_count` staging buffers ahead of each all-gather (as far ahead as the buffers allow),
// its reduced gradients are accumulated in a staging buffer and written back after each
// reduction, and the optimizer streams master and gradient (and moments on NVMe) in pieces.
struct ParamOffload {
  OffloadDevice device = OffloadDevice::None;
  std::string nvme_path;
  int buffer_count = 5;  // Nvme: staging buffers for gathers (each one unit's shard), >= 2
  // Nvme: parameter elements (per rank: master shard elements) kept in host memory instead:
  // the first units, in order, while their shards fit together (partial offload). 0: all.
  int64_t max_in_cpu = 0;
  // Whether unit u (shard of shard_floats[u] elements, units in order) is in the file.
  bool on_nvme(int u, const std::vector<int64_t>& shard_floats) const;
};

// Compressed collectives (ZeRO++'s qwZ / qgZ; sharding/comm/quantize.h): block-wise int8 or
// int4 with one fp32 scale per `block` values. weights (zero_quantized_weights): a sharded
// unit's all-gather moves each rank's master shard quantised (the master stays exact; the
// gathered compute copy is dequantised). gradients (zero_quantized_gradients): the gradient
// reduce-scatter is all-to-all based with quantised messages and error feedback (a residual
// per unit, Mem::Grads: +4 bytes per parameter, unsharded), and HYBRID's replica all-reduce is
// that reduce-scatter plus a quantised gather of each reduced chunk (its residual kept by the
// chunk's owner). Per mesh dimension (`scope`): "replicate" (default) compresses what crosses
// hosts: HYBRID_SHARD's replica all-reduce only (its shard group is a host: full precision),
// every other sharded strategy's one data-parallel group; "all": the shard group too.
// CPU devices, fp32 reduce_dtype, sharded strategies; run on the calling thread (no overlap).
struct CommQuantization {
  bool weights = false;
  bool gradients = false;
  int bits = 8;          // 8 or 4
  int64_t block = 256;   // values per fp32 scale
  bool all_dims = false;  // scope "all"
  bool any() const { return weights || gradients; }
};

// Local SGD / DiLoCo's outer step (sharding/cross_group.h): SGD with momentum (torch.optim.SGD's
// update, Nesterov optional) on the pseudo-gradient, which crosses the replica groups in `dtype`
// (F32 or BF16), or block-quantised to `bits` (8 or 4; 0: not) with error feedback. Streaming
// (fragment_sync_delay > 0): the update lands inner steps after the reduce was issued, and a
// fragment's parameters become alpha * local + (1 - alpha) * the outer result (torchft's
// fragment_update_alpha; 0 = the outer result).
struct OuterArgs {
  float lr = 0.7f, momentum = 0.9f;
  bool nesterov = true;
  DType dtype = DType::F32;
  int bits = 0;
  float alpha = 0.f;
};
// Which half of an outer step a call runs: both at once, or the reduce (issued, not waited for)
// and later the update (streaming with a delay).
enum class OuterPhase : uint8_t { Both, Reduce, Update };

struct ShardingPolicy {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  // HYBRID_SHARD: ranks per shard group (consecutive world ranks); must divide the world size.
  // 0 = the whole world (then HYBRID_SHARD is FULL_SHARD). Ignored by other strategies.
  int shard_group_size = 0;
  // Stages 2/3/HYBRID: free a unit's gathered parameters after its last forward call and
  // gather again for backward (true: FULL_SHARD), or keep them until its backward (false:
  // SHARD_GRAD_OP). The unit that runs last in forward is always kept (backward starts with
  // it), and so is a unit with several calls between its first and last (GPT-2's tied
  // embedding/head).
  bool reshard_after_forward = true;
  // How many units ahead (in schedule order) forward issues all-gathers, and how many units
  // behind backward issues them (0 = gather only when needed).
  int forward_prefetch = 1;
  int backward_prefetch = 1;
  // Cap on units whose gathered parameters are allocated at once, counting prefetches in
  // flight; prefetches that would exceed it are not issued (a unit that is needed now is
  // always gathered). 0 = no cap (the prefetch depths bound it).
  int max_live_units = 0;
  // Free each unit's gradients once its optimizer update has read them, and allocate them
  // again (zero) at its next backward, so that no gradient memory is held between steps
  // (PyTorch's zero_grad(set_to_none=True) under FSDP2). Applies to units whose gradients are
  // their own buffer on the compute device: a Whole unit's (one rank; not a NO_SHARD bucket's
  // region) and a sharded unit's reduced shard; not where the optimizer or the parameters are
  // offloaded, nor stage 1's persistent full gradients (releases_grads in step_plan.h).
  // Values are unchanged; a read between the update and the next backward sees zeros.
  bool release_grads = false;
  GradAccumMode accum = GradAccumMode::ReduceEachMicroStep;
  // NO_SHARD: gradients are all-reduced in buckets of about this many bytes, each issued as
  // soon as the last unit in it has finished its backward (DDP's bucket_cap_mb, 25 MiB).
  int64_t bucket_bytes = int64_t{25} << 20;
  MixedPrecisionPolicy mixed_precision;
  ActivationCheckpointing activation_checkpointing;
  OptimizerOffload offload_optimizer;
  ParamOffload offload_param;
  // How unit buffers on a non-CPU device reach the peers (sharding/comm/group.h DeviceComm):
  // the device's own collectives (NCCL), the host group through staging buffers, or auto.
  DeviceComm device_comm = DeviceComm::Auto;
  // The asynchronous I/O engine of the io queue (DeepSpeed's "aio" block, offload/aio.h).
  AioConfig aio;
  // zero_quantized_weights / zero_quantized_gradients (above).
  CommQuantization quantized;

  // The defaults of a strategy (reshard_after_forward and accum follow it).
  static ShardingPolicy for_strategy(ShardingStrategy s);
  std::string describe() const;  // "FULL_SHARD(reshard_after_forward=1, prefetch=1/1, ...)"
};

// The policy's own rules, whoever built it (the config reader, code using the C++ API, the
// planner's candidates): mixed-precision dtypes, prefetch depths and max_live_units >= 0,
// shard_group_size dividing `world`, offload ratio in [0, 1], staging buffers >= 2, an
// nvme_path with every 'nvme' device, NVMe parameters only with a strategy that shards them,
// activation_checkpointing.every >= 1 and its units within `units`. Throws one sw::Error line
// "sharding: <key>: <problem>", <key> being the config key of the field at fault (the config
// reader re-labels it as the file's error). world / units: the ranks the policy runs on and
// the model's unit count; 0 = not known (those two checks are then skipped).
void validate(const ShardingPolicy& p, int world = 0, int units = 0);

}  // namespace sw
