// The memory every plan starts from (sharding/plan_builder.h): each unit's persistent state by
// category and tier (sharding/unit_state.h has the table of which buffer lives when), the NVMe
// files' bytes, the staging buffers, and the step's workspace reserved once (the largest Scratch
// any call asks for, backward's ping-pong buffers).
#include <algorithm>

#include "sharding/loss_slots.h"
#include "sharding/plan_builder.h"

namespace sw {

void plan_memory(const PlanInput& in, StepPlan& plan) {
  auto add_p = [&](Mem m, int64_t bytes) { plan.persistent[static_cast<size_t>(m)] += bytes; };
  const bool mp = in.policy.mixed_precision.param_dtype != DType::F32;
  const bool w16 = in.policy.mixed_precision.weights16(in.on_device);
  int64_t max_scratch = 0;
  for (const CallMemory& c : in.calls) max_scratch = std::max(max_scratch, c.scratch);
  for (size_t ui = 0; ui < in.units.size(); ++ui) {
    const PlanUnit& u = in.units[ui];
    const int64_t full = u.padded * 4, shard = full / in.S;
    // release_grads: allocated and freed within the step (PlanBuilder), never held across it.
    const bool held = !releases_grads(in, static_cast<int>(ui));
    // Offloaded parameters: the master (and reduced gradient) shard on the host tier.
    auto add_m = [&](Mem m, int64_t bytes) {
      if (u.params_offloaded)
        plan.persistent_host[static_cast<size_t>(m)] += bytes;
      else
        add_p(m, bytes);
    };
    const bool split = mp || u.params_offloaded;
    // the persistent full parameters (kinds B and C): the fp32 buffer and its 16-bit copy
    const int64_t fullp = full_params_bytes(u, w16);
    switch (in.kind) {
      case UnitKind::Sharded:
        if (u.params_nvme) {  // in the file; staged through the buffers counted below
          plan.shard_bytes = std::max(plan.shard_bytes, shard);
          break;
        }
        add_m(Mem::Params, shard);
        if (held) add_m(Mem::Grads, shard);
        break;
      case UnitKind::FullReplicated:
        add_p(Mem::Params, fullp);
        if (split) add_m(Mem::Params, shard);
        add_p(Mem::Grads, full);
        add_m(Mem::Grads, shard);
        break;
      case UnitKind::Whole:
        add_p(Mem::Params, fullp);
        if (split) add_m(Mem::Params, full);
        if (held) add_p(Mem::Grads, full);  // its own buffer or its region of the bucket buffer
        break;
    }
    if (u.params_nvme) plan.nvme_bytes += 2 * shard;
    if (u.optimizer_nvme)
      plan.nvme_bytes += 2 * shard;  // in the file; staged through the buffers below
    else if (u.optimizer_offloaded)
      plan.persistent_host[static_cast<size_t>(Mem::Optimizer)] += 2 * shard;
    else
      add_p(Mem::Optimizer, 2 * shard);
  }
  StateIoPlan::size_staging(in, plan);
  plan.scratch = max_scratch;
  // The two ping-pong buffers (backward's dy and dx), and on a device with 16-bit products
  // backward's residual gradient in the compute precision (Activations, UnitCtx::grad16).
  const int64_t act = int64_t{4} * in.B * in.T * in.d_model;
  const bool grad16 = in.on_device && in.compute != DType::F32;
  // The step's device-side sums (LossSlots, made at the first micro-step or evaluation and
  // kept): a double per loss slot of the micro-steps and of the evaluations (64 each) and per
  // unit for the gradient norm.
  const int64_t sums = 8 * (2 * LossSlots::kSlots + static_cast<int64_t>(in.units.size()));
  plan.reserved[static_cast<size_t>(Mem::Workspace)] =
      max_scratch + 2 * act + (grad16 ? act / 2 : 0) + sums;
}

// On a device, the host updater's staging (OffloadedState::update_on_host): two offloaded
// updates' master and gradient copies at most.
StepPlan with_updater_staging(StepPlan plan, const PlanInput& in) {
  if (!in.on_device) return plan;
  int64_t most = 0;
  for (const Action& a : plan.actions) {
    if (a.kind != ActionKind::OptimizerUpdate || a.unit < 0) continue;
    const PlanUnit& u = in.units[static_cast<size_t>(a.unit)];
    if (!(u.optimizer_offloaded || u.optimizer_nvme) || u.params_offloaded || u.params_nvme)
      continue;  // (moments on the device, or the master and gradients already on the host)
    most = std::max(most, a.hi >= 0 ? a.hi - a.lo : u.padded / in.S);
  }
  plan.host_update_staging = 2 * 2 * int64_t{sizeof(float)} * most;
  return plan;
}

int64_t full_params_bytes(const PlanUnit& u, bool w16) {
  return w16 ? (u.padded - u.lp_only) * 4 + u.padded * 2 : u.padded * 4;
}

}  // namespace sw
