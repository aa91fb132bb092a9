// ShardedModel's state (internal to sharding/): the context every part reads
// (sharding/model_context.h), the flat units (sharding/unit_state.h), and the components, each
// with its own state (sharding/component.h lists which plan actions each owns). The files:
//   sharded_model.cpp    construction (groups, units, components, initialisation) and the calls
//                        that run the plan's segments
//   param_access.cpp     parameter and gradient access (export, set_param, full copies)
//   state_access.cpp     checkpoint access to the flat state (owned / held ranges)
//   optimizer_step.cpp   the gradient norm, zeroing and the optimizer step
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sharding/action_records.h"
#include "sharding/activations.h"
#include "sharding/batch_upload.h"
#include "sharding/executor.h"
#include "sharding/loss_slots.h"
#include "sharding/model_context.h"
#include "sharding/offloaded_activations.h"
#include "sharding/cross_group.h"
#include "sharding/offloaded_state.h"
#include "sharding/pipe_stage.h"
#include "sharding/plan_cache.h"
#include "sharding/reductions.h"
#include "sharding/tensor_parallel.h"
#include "sharding/sharded_model.h"
#include "sharding/unit_params.h"
#include "sharding/unit_state.h"
#include "sharding/updates.h"

namespace sw {

struct ShardedModel::Impl {
  // Validates the policy, makes the groups (collective) and the plan's view of the model, then
  // the components and the units (their buffers zeroed), and the NVMe files.
  Impl(Model& model, const Ops& ops, GroupPtr group, const ShardingPolicy& policy,
       GroupPtr tensor, PipeSetup pipe, GroupPtr replicas);
  ~Impl() { quiesce(); }

  ModelContext ctx;
  UnitList units;  // before the components: they go first
  ActionRecords records;
  LossSlots losses;
  BatchUpload batches;
  PlanCache plans;
  OffloadedState state;
  Reductions reductions;
  UnitParams params;
  Activations acts;
  Updates updates;
  OffloadedActivations act_io;
  TensorParallel tp;
  PipeStage pipe;
  CrossGroup cross;
  Executor exec;
  // Global parameter name -> (unit, spec index).
  std::unordered_map<std::string, std::pair<int, int>> by_name;
  // gather_full_params: per unit, the gathered parameters (empty on ranks other than 0 with
  // rank0_only).
  std::vector<Buffer> summoned;
  bool summon_held = false, summon_rank0_only = false;
  // Tensor parallelism: each tensor rank's split of the parameter named (param_access.cpp),
  // from the units built for every tensor rank (made on first use).
  const std::vector<TensorSplit>& tensor_splits(const std::string& name);
  std::unordered_map<std::string, std::vector<TensorSplit>> splits;
  const Model* model = nullptr;

  // ---- Segments ---------------------------------------------------------------------------
  // One micro-step's forward and backward (the plan for this batch and the units in flight).
  void micro_step(Model& model, const Batch& batch, RunArgs& args, bool reduce, bool last);
  // The pipeline segment: every micro-batch (args' batches, scales, loss doubles).
  void pipeline_step(Model& model, RunArgs& args, int B, int T, int micro_batches);
  // Pipeline: the last stage's per-batch loss sums and counts sent to every pipe rank.
  void share_losses(std::vector<double>& sums, std::vector<int64_t>& counts);
  // Forward only: with `logits`, the last positions' logits copied out; else the loss summed
  // into *loss_slot (a double of the device, zeroed here, not read).
  RunArgs forward_only(Model& model, const Batch& batch, float* logits, double* loss_slot);
  // Applies the deferred updates now (the flush plan) and zeroes the gradients zero_grads left
  // for after them: before anything reads or writes parameters or optimizer state outside a
  // micro-step. A no-op when none is pending.
  void flush_deferred(Model& model);
  // Waits for everything in flight and drops the step's activations and gathers (an exception
  // in the middle of a segment: the caller stops or restores a checkpoint).
  void abandon_step();
  void quiesce() noexcept;
};

}  // namespace sw
