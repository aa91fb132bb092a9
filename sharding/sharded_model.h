// Runs a Model over flat, sharded parameters (FSDP / ZeRO). Owns, per unit: the fp32 master
// shard, the gathered parameter buffer, gradient buffers and AdamW moments (all tracked by
// category; sharding/unit_state.h has the table of which buffer lives when), and drives the
// per-unit state machine over the model's schedule:
//
//   forward   unit k: wait for its all-gather; issue unit k+1's (forward prefetch); compute;
//             free the gathered parameters after the unit's last forward call when the policy
//             reshards after forward (FULL_SHARD; the unit that runs last stays gathered, and
//             so does a unit whose calls span the schedule, like GPT-2's tied embedding/head).
//   backward  unit k: wait for its gather; issue unit k-1's (backward prefetch); compute;
//             after the unit's last backward call free its parameters and issue the
//             reduce-scatter of its gradients, which runs while unit k-1 computes; every
//             reduction is waited for before forward_backward returns.
//   optimizer AdamW on this rank's slice of every unit (fp32 master); stage 1 then all-gathers
//             the updated slices (waited for at the unit's next use); sharded strategies
//             issue the gathers of the first forward_prefetch units of the next forward as
//             soon as those units are updated, so they overlap the remaining updates.
// Strategies, gradient accumulation modes and the memory of each are in sharding/policy.h.
// Mixed precision (policy.mixed_precision): masters and AdamW stay fp32 with `ops`; units
// compute with ops_for(device, param_dtype) on the rounded parameters, which are gathered in
// param_dtype; gradients are reduced in reduce_dtype (sharding/unit_state.h has the details).
//
// Ranks and scaling: each rank runs its own micro-batch; forward_backward returns the mean loss
// over this rank's tokens, and gradients are AVERAGED over ranks (reduce-scatter / all-reduce
// with ReduceOp::Avg), so N ranks with B rows each produce the gradient of the mean loss over
// the N*B rows (exactly when every rank counts the same number of target tokens).
//
// Collectives: with more than one rank, every method that says "collective" must be called by
// every rank of the group, in the same order, with the same arguments where they matter
// (batch shapes, last_micro_step). zero_grads, set_param and num_params never communicate.
// World size 1 (the first constructor, or a one-rank group) never communicates and keeps the
// master shard, the gathered parameters and the gradient shard in the same memory.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/flat_param.h"
#include "sharding/policy.h"
#include "sharding/step_plan.h"

namespace sw {

// A half-open float range [lo, hi) of a unit's flat buffer (checkpoint access below).
struct FlatRange {
  int64_t lo = 0, hi = 0;
  int64_t size() const { return hi > lo ? hi - lo : 0; }
  bool empty() const { return hi <= lo; }
};

// The optimizer (config `optimizer`: DeepSpeed's type names and keys) and its parameters.
// Each uses the unit's two moment buffers (checkpointed as exp_avg / exp_avg_sq whatever the
// type): AdamW and Lamb m and v; SGD and LARS m (the momentum buffer; v stays zero).
// weight_decay applies to the parameters whose ParamSpec says so (not biases and norms):
//   AdamW  decoupled (torch.optim.AdamW)
//   SGD    torch.optim.SGD: d = g + wd p; m = d (step 1) else momentum m + (1 - dampening) d;
//          d = nesterov ? d + momentum m : m (momentum 0: d); p -= lr d
//   LARS   SGD on d = t (g + wd p), t = trust_coefficient |p| / (|g| + wd |p| + eps) per
//          tensor (1 where |p| or |g| is 0), LARC's / timm's; tensors without weight decay
//          (biases, norms) are excluded (t = 1, no decay)
//   Lamb   DeepSpeed's FusedLamb: m, v as Adam; u = m / (sqrt(v) + eps) + wd p;
//          c = clamp(|p| / |u|, min_coeff, max_coeff) per tensor (1 where either is 0);
//          p -= lr sqrt(1 - beta2^t) / (1 - beta1^t) c u (bias_correction; else lr c u)
// |x| is the L2 norm of a whole parameter tensor (summed over the shard and tensor groups).
enum class OptimizerType : uint8_t { AdamW, SGD, LARS, Lamb };
const char* optimizer_type_name(OptimizerType t);  // "AdamW", "SGD", "LARS", "Lamb"
OptimizerType optimizer_type_from_name(const std::string& s);  // those, "Adam" too (AdamW)

struct OptimizerParams {
  OptimizerType type = OptimizerType::AdamW;
  float lr = 3e-4f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;  // AdamW, Lamb (LARS: eps)
  float weight_decay = 0.1f;
  float momentum = 0.f, dampening = 0.f;  // SGD, LARS
  bool nesterov = false;
  float trust_coefficient = 1e-3f;        // LARS
  float max_coeff = 10.f, min_coeff = 0.01f;  // Lamb
  bool bias_correction = true;                // Lamb
  // LARS and Lamb scale each tensor's update by a ratio of whole-tensor norms.
  bool per_tensor() const { return type == OptimizerType::LARS || type == OptimizerType::Lamb; }
};
using AdamWParams = OptimizerParams;  // (its first users' name; AdamW by default)

// Pipeline parallelism: the model given is one pipeline rank's stage (stage_model), `group`
// the ranks that hold the same data and tensor slot in every stage (ranked by pipeline rank,
// Model::stage.rank being this one's) and `schedule` a PipeSchedule (pipeline_schedule.h).
struct PipeSetup {
  GroupPtr group;
  int schedule = 0;
};

class ShardedModel {
 public:
  // Initialises every parameter from (seed, its global name, element index) only, so any
  // number of ranks starts from exactly the weights one rank would. One rank, no communication.
  ShardedModel(Model& model, const Ops& ops, uint64_t seed);
  // Sharded over `group` as `policy` says. Collective (HYBRID_SHARD splits the group); throws
  // sw::Error("sharding: ...") when shard_group_size does not divide the group size.
  // Tensor parallelism: `group` is the data-parallel group (the ranks holding the same tensor
  // slice; the policy shards over it) and `tensor` the model's tensor group (the ranks of one
  // data-parallel slot, consecutive; model.tensor says which of them this rank is, and its
  // size must be model.tensor.size). Null tensor: a model that is not split.
  // Local SGD / DiLoCo: `group` is one replica's ranks and `replicas` the ranks holding the same
  // shard in every replica (outer_step averages over it; null: none).
  ShardedModel(Model& model, const Ops& ops, uint64_t seed, GroupPtr group,
               const ShardingPolicy& policy, GroupPtr tensor = nullptr, PipeSetup pipe = {},
               GroupPtr replicas = nullptr);
  ~ShardedModel();

  Model& model() { return model_; }

  // Collective. One micro-batch forward and backward; gradients ACCUMULATE across calls until
  // zero_grads(). d(loss) is scaled by grad_scale / (tokens counted on this rank). Returns the
  // mean loss over this rank's tokens. `last_micro_step`: false on every micro-step of an
  // optimizer step but the last, so GradAccumMode::ReduceOnce can postpone the reduction
  // (ReduceEachMicroStep ignores it). Gradients not yet reduced are reduced by grad_norm,
  // optimizer_step and for_each_grad.
  // Reads the loss (and those of micro_step calls not yet read) from the device at once.
  double forward_backward(const Batch& batch, float grad_scale = 1.f, bool last_micro_step = true);
  // Collective. forward_backward without reading the loss: on a device the host does not wait
  // for the device's work (the loss stays there until step_losses or grad_norm reads it).
  void micro_step(const Batch& batch, float grad_scale = 1.f, bool last_micro_step = true);
  // Collective over every stage. Pipeline parallelism: the step's micro-batches (each rank
  // passes the same ones as the other stages of its pipe group) forward and backward in the
  // schedule's order, gradients reduced at each unit's last backward; grad_scales[k] is
  // micro_step's grad_scale for micro[k]. The last stage's losses reach every rank:
  // step_losses then has one per micro-batch. Refused without a pipeline.
  void pipeline_step(const std::vector<Batch>& micro, const std::vector<float>& grad_scales);
  bool pipelined() const;
  // Collective over every replica. Local SGD / DiLoCo (a model made with `replicas`): the outer
  // step of fragment `fragment` of `fragments` (consecutive units; 1: all): each unit's
  // pseudo-gradient (the round's start minus now) averaged over the replicas, the outer
  // optimizer (SGD lr, momentum, Nesterov, crossing in `dtype`) applied to the round's start,
  // and every replica's parameters set to it. start_round: the round starts from the parameters
  // as they are (after initialisation, a resume, an import).
  // OuterArgs (sharding/policy.h) adds quantised pseudo-gradients and, with `phase`, the
  // streaming split: Reduce issues the fragment's reduces and returns; a later Update (after
  // inner steps) waits for them and applies the outer optimizer, mixing with alpha.
  void outer_step(float lr, float momentum, bool nesterov, DType dtype, int fragment = 0,
                  int fragments = 1) {
    outer_step(OuterArgs{lr, momentum, nesterov, dtype, 0, 0.f}, fragment, fragments);
  }
  void outer_step(const OuterArgs& o, int fragment = 0, int fragments = 1,
                  OuterPhase phase = OuterPhase::Both);
  void start_round();
  // Local SGD: the replica groups (1 without) and this rank's replica (its rank in `replicas`).
  int replicas() const;
  int replica() const;
  // Whether a checkpoint load restored the round (its start, momentum, reduces in flight): the
  // caller then does not start_round.
  bool round_restored() const;
  // State a bitwise resume needs beyond the master and moments (checkpoint/sharded_checkpoint.*):
  // named fp32 host buffers of this rank: local SGD's round ("outer.u<u>.anchor|momentum|delta|
  // qerr1|qerr2", cross_group.h) and the quantised gradient reductions' error-feedback residuals
  // ("qgz.u<u>.shard": the shard group's, "qgz.u<u>.rep1|rep2": the replicas' all-reduce). A
  // reduce in flight is waited for first. restore_target: where a load writes `name` (made,
  // zeroed, if it does not exist yet; an outer delta is then in flight); null for a name this
  // model has no place for. Host memory only (local SGD and quantised collectives are CPU-only).
  struct NamedState {
    std::string name;
    float* data;
    int64_t n;
  };
  std::vector<NamedState> extra_state();
  float* restore_target(const std::string& name, int64_t n);
  // Local. The mean loss over this rank's tokens of each micro_step (and forward_backward)
  // since the last call, in order; then forgets them. The losses grad_norm has already read
  // come without a synchronisation; the rest are read now, in one copy.
  std::vector<double> step_losses();
  // Collective. Forward only; returns the mean loss over this rank's tokens. On a device it
  // reads that loss at once (and forgets the eval_steps not yet read by eval_losses).
  double eval_loss(const Batch& batch);
  // Collective. eval_loss without reading the loss: on a device it stays there until
  // eval_losses (an evaluation of n batches synchronises the host once, or once per 64).
  void eval_step(const Batch& batch);
  // Local. The mean loss over this rank's tokens of each eval_step since the last call, in
  // order; then forgets them. One read of those not read yet.
  std::vector<double> eval_losses();
  // Collective. Forward only; writes (B, V) logits of each sequence's last position.
  void logits_last(const Batch& batch, float* logits);

  // Collective. Global L2 norm of the accumulated (reduced) gradients: this rank's sum of
  // squares, summed over the shard group in double precision, identical on every rank. On a
  // device, the one read of the device's sums also brings the unread micro-steps' losses
  // (so a step of micro_steps, grad_norm, step_losses and optimizer_step synchronises the host
  // with the device once).
  double grad_norm() const;
  void zero_grads();
  // Collective. The optimizer (p.type: AdamW by default) on this rank's slice of every
  // parameter; grads multiplied by grad_mult first (clipping). step from 1. LARS and Lamb
  // first sum each tensor's squares over the shard (and tensor) group, in rank order. On a device with offload_optimizer cpu, the offloaded
  // units' updates may still run on the host updater thread when this returns: each unit
  // waits for its own where it is next touched (the next forward's gather, say).
  void optimizer_step(const OptimizerParams& p, float lr, float grad_mult, int step);
  // Units whose update runs on the host updater thread now. Tests: hold_host_updates(true)
  // keeps that thread from starting another update until hold_host_updates(false).
  int host_updates_in_flight() const;
  void hold_host_updates(bool on);
  // Seconds the host updater thread has spent running updates (copies waited for, AdamW, the
  // copy back) since construction: a profile of the host side of the step.
  double host_update_seconds() const;

  // Collective (unless gather_full_params holds a copy). Full parameters, one call per
  // ParamSpec in unit order, gathered one unit at a time.
  void for_each_param(const std::function<void(const ParamSpec&, const float* data)>& fn) const;
  // Collective. Accumulated reduced gradients, same order and shapes as for_each_param.
  void for_each_grad(const std::function<void(const ParamSpec&, const float* grad)>& fn) const;
  // Overwrites a parameter by global name (throws sw::Error if unknown or size differs). Every
  // rank passes the full tensor and keeps what it owns.
  void set_param(const std::string& name, const float* data, int64_t n);
  // Whether set_param(name, ...) keeps anything on this rank (a full copy it holds, or a shard
  // overlapping the parameter); never communicates. An import reads only the tensors this
  // rank holds part of (checkpoint/hf_import.h). Throws sw::Error if the name is unknown.
  bool holds_param(const std::string& name) const;

  // Collective: gathers every parameter into a consolidated copy (Mem::Communication) that
  // for_each_param then reads without communicating, so one rank can export alone (FSDP's
  // full state dict). rank0_only: ranks other than 0 keep nothing and must not call
  // for_each_param until release_full_params().
  void gather_full_params(bool rank0_only = false);
  void release_full_params();

  int64_t num_params() const;
  int rank() const;   // in the group given at construction
  int world() const;  // its size
  const ShardingPolicy& policy() const;
  Group& group() const;  // the group given at construction
  // Tensor parallelism: the tensor group (null: the model is not split).
  Group* tensor_group() const;
  // The most units whose gathered parameters were allocated at once (transient gathers,
  // prefetches in flight included) during the last forward_backward: what max_live_units caps.
  int peak_gathered_units() const;
  // The plan of one whole training step (accum micro-steps of B rows of T tokens, then the
  // optimizer) in the steady state, exactly as the executor runs it; and of an eval forward.
  // deferred: per schedule position, zero bubble's copies kept for the weight gradients
  // (CallMemory::deferred; planner/pipeline.h measure_deferred), empty: not counted.
  StepPlan step_plan(int B, int T, int accum, const std::vector<int64_t>& deferred = {}) const;
  // Activation offload to NVMe: creates the file and reserves what a micro-step of B x T
  // writes to it (the free-space check: sw::Error naming activation_checkpointing.nvme_path),
  // so a disk without room is an error before training. A no-op otherwise.
  void prepare_offload(int B, int T);
  // Whether some checkpointed state (master weights, AdamW moments) lives in NVMe files
  // (offload_param / offload_optimizer device nvme): a checkpoint then streams it from the
  // files through bounded staging, and an asynchronous snapshot (a full copy in host memory)
  // would defeat the offload.
  bool state_on_nvme() const;
  // The NVMe staging buffers in host memory (parameters, gradients, optimizer pieces): the
  // pages they span and how many of those are resident now (mincore), in bytes. Pages no
  // transfer wrote are not resident (buffers are not zeroed); the planner's RSS model counts
  // them out (planner/search.h).
  struct StagingResidency {
    int64_t bytes = 0, resident = 0;
  };
  StagingResidency staging_residency() const;
  StepPlan eval_plan(int B, int T) const;
  // While set (not null), the executor appends a record of every action it runs (begin and end
  // times; a collective's are when it started and finished executing) to *recorder.
  // On a GPU, every action whose work ran on a device stream (compute, NCCL's, a copy stream)
  // is recorded with that stream's times (when it ran there, from timed events;
  // ActionRecord::stream names it), filled in by settle_recorder() (it waits for the device)
  // before the records are read, and by set_recorder itself for the recorder it replaces,
  // which must therefore still exist (detach a recorder before destroying it).
  void set_recorder(StepRecorder* recorder);
  void settle_recorder();
  // Communication time of the groups this model uses (comm_s, exposed_s summed over them).
  CommStats comm_stats() const;
  void reset_comm_stats();

  // ---- Checkpoint access (checkpoint/sharded_checkpoint.*) ----------------------------------
  // A unit's flat state is three fp32 buffers over its FlatLayout: master parameters, AdamW m
  // and AdamW v, each `padded` floats of which [0, used) matter (alignment gaps and padding
  // are zero). Ranges are in floats of that flat buffer; `layout.world` is the shard group
  // size S, not the world size.
  //
  // owned_range(u): what this rank WRITES to a checkpoint, the same range for all three kinds.
  // Disjoint across the world's ranks and together exactly [0, used): the rank's shard (the
  // whole buffer when S == 1) clipped to `used`, split evenly among the R = W / S replicas that
  // hold it, replica q (= world rank / S) taking the q-th part. So NO_SHARD's W ranks each
  // write 1/W of every unit and HYBRID's replicas share their shard's writing.
  // held_range(u, k): what this rank STORES of kind k and must load: the shard clipped to
  // `used` (sharded strategies), [0, used) for stage 1's master (its persistent full buffer)
  // and for everything with S == 1.
  enum class StateKind : uint8_t { Master, ExpAvg, ExpAvgSq };
  int num_units() const;
  const FlatLayout& unit_layout(int u) const;
  // Unit u's parameters as logical tensors (tensor parallelism: the shape of the whole tensor,
  // no split; otherwise unit_layout(u).specs): what for_each_param hands out.
  std::vector<ParamSpec> logical_specs(int u) const;
  std::string unit_name(int u) const;
  FlatRange owned_range(int u) const;
  FlatRange held_range(int u, StateKind k) const;
  // Local. Copy r (inside held_range(u, k)) out of / into this rank's state. Before reading,
  // pending updates are complete (a stage-1 regather is waited for); writing master data drops
  // any gathered copy of the unit (it is stale) and any gather_full_params copy. write_state
  // of a stage-1 master range must cover what other ranks would otherwise regather: callers
  // load held_range entirely (load_checkpoint does).
  // State on a device (state_on_device()): `dst` / `src` are host memory all the same; the
  // range is copied device -> host / host -> device with copy_bytes (complete on return,
  // ordered after the device's queued work). On the CPU, plain copies.
  void read_state(int u, StateKind k, FlatRange r, float* dst) const;
  // Local. r (inside held_range(u, k)) in place, after the same wait as read_state: for a
  // reader that would only copy it elsewhere (a synchronous checkpoint writes it to disk).
  // Valid until the state next changes (optimizer step, write_state, regather). Host memory
  // only: throws sw::Error when state_on_device() (the host must not dereference device
  // memory; such readers copy ranges out with read_state into memory of their own).
  const float* state_view(int u, StateKind k, FlatRange r) const;
  void write_state(int u, StateKind k, FlatRange r, const float* src);
  // Whether the state above lives in device memory (a model built with the Ops of a device
  // other than the CPU): then only read_state / write_state reach it.
  bool state_on_device() const;

  struct Impl;  // sharding/sharded_model_impl.h (internal)

 private:
  // r of kind k after the waits a reader needs: a host pointer on the CPU (in place, or an
  // NVMe tier's read buffer), a device pointer when state_on_device() (state_access.cpp).
  const float* state_source(int u, StateKind k, FlatRange r) const;

  Model& model_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sw
