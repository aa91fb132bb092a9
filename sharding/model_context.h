// What every component of a ShardedModel reads and none writes once the model is built: the
// Ops, the sharding policy, the groups and the plan's view of the model. The components
// (sharding/component.h) each keep their own state; this is the part they share.
//
// Groups: a world group of W ranks is seen as S-rank shard groups times R-rank replicate groups
// (S * R = W). FULL_SHARD / SHARD_GRAD_OP / SHARD_OPTIMIZER: S = W, R = 1. NO_SHARD: S = 1,
// R = W. HYBRID_SHARD: S = shard_group_size (consecutive ranks), R = W / S. Parameters are
// sharded over the shard group; gradients are reduce-scattered (averaged) over it, then
// all-reduced (averaged) over the replicate group. With S = 1 there is nothing to scatter:
// gradients are all-reduced in place, in buckets (DDP).
#pragma once
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "sharding/comm/group.h"
#include "sharding/comm/p2p.h"
#include "sharding/comm/quantize.h"
#include "sharding/policy.h"
#include "sharding/step_plan.h"

namespace sw {

class FlatUnit;
// A model's flat units, in unit order (sharding/unit_state.h). Shared by the components: each
// unit's own state machine guards its transitions.
using UnitList = std::vector<std::unique_ptr<FlatUnit>>;

struct ModelContext {
  const Ops* ops = nullptr;          // utilities and the optimizer (fp32)
  const Ops* compute_ops = nullptr;  // what units run with: ops_for(device, param_dtype)
  std::shared_ptr<const Ops> fp8_ops;  // policy fp8: the Fp8Ops compute_ops points to
  ShardingPolicy policy;
  // world: the group given at construction; shard, rep: the groups of the unit buffers'
  // collectives (on a device, device_group()s of shard_host and the replicate group);
  // shard_host: the shard group over the host, for host scalars (grad_norm). rep: null when
  // R == 1.
  GroupPtr world, shard, rep, shard_host;
  // tensor: the model's tensor group (tensor parallelism; null: the model is not split). The
  // groups above are then the data-parallel ones (ranks holding the same tensor slice).
  // tensor_host: the same ranks over the host (host scalars, logical parameter copies).
  GroupPtr tensor, tensor_host;
  // pipe: the ranks holding the same data and tensor slot in every stage (pipeline
  // parallelism; null: one stage), p2p its point-to-point transport; shared: the two pipe
  // ranks holding a shared unit (Model::stage.shared; null on the others).
  GroupPtr pipe, shared;
  // cross: local SGD / DiLoCo's replica groups (the ranks holding this shard in every replica;
  // null: gradients are reduced every step). The groups above are then one replica's.
  GroupPtr cross;
  std::shared_ptr<PeerComm> p2p;
  // Compressed collectives (policy.quantized; setup_quantized, reductions.h): the block format,
  // whether sharded units gather quantised, and the transports of the quantised gradient
  // reductions: over the shard group (qshard) and over the replicas (qrep); null: full precision.
  QuantSpec quant;
  bool quant_weights = false;
  std::shared_ptr<PeerComm> qshard, qrep;
  std::shared_ptr<QuantWorker> qworker;  // runs qshard's and qrep's reductions (made with them)
  int W = 1, S = 1, R = 1;
  int rank = 0;  // in world
  // This process's own number among every rank of the job, for per-rank files (NVMe offload):
  // rank, or with tensor parallelism data rank x t + tensor rank.
  int file_rank = 0;
  // What plans are built from (sizes, groups, buckets); B, T and carried are set per plan.
  PlanInput plan_in;

  Device device() const { return ops->device(); }
  bool on_device() const { return !ops->device().is_cpu(); }
};

}  // namespace sw
