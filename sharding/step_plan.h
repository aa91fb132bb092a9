// The step as a plan (docs/ARCHITECTURE.md, "The step plan"). A pure function turns what a
// step is made of (the model's schedule, the units' flat sizes, the sharding policy, the batch
// shape and the units' declared activation sizes) into the ordered, typed actions of one
// training step, each on a queue, with the actions it waits for, the bytes it moves and the
// bytes it allocates or frees per memory category. The executor (sharding/executor.h) runs
// exactly these actions; the memory planner replays them without running the model; the
// profiler records each one's begin and end; offload adds fetch / evict actions on the io queue.
//
// Queues (what a CUDA build maps to streams, docs/ARCHITECTURE.md):
//   compute  forward, backward, recompute, frees, waits, optimizer updates (the host thread on
//            the CPU backend; the compute stream on CUDA)
//   gather   all-gathers of parameters (the shard group's communication thread / stream)
//   reduce   reduce-scatters and all-reduces of gradients (same thread on the CPU backend,
//            which keeps one ordered sequence of collectives per group)
//   io       fetch / evict of offloaded state and activations (the offload store's io queue
//            and, on a device, its copy streams)
// An action on one queue never waits for a later action: waits point backwards in the list.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "models/model.h"
#include "sharding/policy.h"

namespace sw {

// Host: in records only (no plan action is on it): the host updater thread's jobs, each an
// offloaded unit's update as it ran there (ShardedModel's optimizer on a device).
// Tensor: the tensor group's collectives (tensor parallelism; its communication thread).
// P2P: pipeline parallelism's sends and receives between stages (the pipe group's
// point-to-point transport, sharding/comm/p2p.h).
// Cross: local SGD / DiLoCo's outer step across replica groups (sharding/cross_group.h).
enum class Queue : uint8_t { Compute, Gather, Reduce, IO, Host, Tensor, P2P, Cross, Count };
// "compute", "gather", "reduce", "io", "host", "tensor", "p2p", "cross"
const char* queue_name(Queue q);

enum class ActionKind : uint8_t {
  Gather,          // gather: all-gather unit u's parameters (allocates its transient buffer)
  WaitGather,      // compute waits for unit u's gather (the event of the Gather / Regather)
  Forward,         // compute: position pos's forward (allocates its output and Saved)
  DropSaved,       // compute: activation checkpointing frees Saved of pos (all, or Cheap)
  Recompute,       // compute: rebuilds Saved of pos before its backward (Full or Selective)
  Backward,        // compute: position pos's backward (frees its input and Saved)
  Free,            // compute: reshard unit u (frees the transient full parameters)
  ReduceScatter,   // reduce: unit u's gradients over the shard group (Avg)
  AllReduce,       // reduce: HYBRID: unit u's reduced block over replicas, after its
                   // ReduceScatter; NO_SHARD: bucket b (every member's backward done)
  RoundGrads,      // compute: one rank alone rounds unit u's gradients to reduce_dtype
  WaitReduce,      // compute waits for the reductions it lists (completing them frees the
                   // transient gradients; the end of backward waits for all)
  OptimizerUpdate, // compute: AdamW on unit u's shard
  Regather,        // gather: stage 1, all-gather the updated slices of unit u in place
  FetchState,      // io: read what `io` names of unit u from its NVMe file into staging `slot`:
                   // the optimizer's piece [lo, hi) (moments, and master + gradient with NVMe
                   // parameters); a master shard ahead of its Gather; the reduced gradients a
                   // reduction accumulates into (skipped while they are zero)
  EvictState,      // io: write back what `io` names (the optimizer's piece after its update; a
                   // unit's reduced gradients after its reduction)
  WaitState,       // compute waits for the fetch_state / evict_state actions it lists
  FetchActs,       // io: bring position pos's input and Saved back from the host tier or the
                   // activation file before its backward (activation offload)
  EvictActs,       // io: move pos's input and Saved to the host tier or the file after its
                   // forward
  WaitActs,        // compute waits for the fetch_acts / evict_acts actions it lists (an evict's
                   // device bytes are freed here once its copy or write is done)
  // Tensor parallelism (sharding/tensor_parallel.h). The first three run inside the compute
  // action `inside` (a call asks for them, in the order its unit declares,
  // Unit::declare_tensor_comm), which waits for each.
  TpGatherRows,    // tensor: sequence-parallel rows all-gathered (TensorOp::GatherRows)
  TpScatterRows,   // tensor: partial sums reduce-scattered to each rank's rows
  TpAllGather,     // tensor: a call's small per-row statistics all-gathered
  TpReduceGrads,   // tensor: unit u's replicated parameters' gradients summed over the tensor
                   // group (before its data-parallel reduction)
  // Pipeline parallelism (sharding/pipe_stage.h): a pipeline segment runs this rank's chunks of
  // the schedule for every micro-batch (Action::micro) in the schedule's order.
  RecvActs,        // p2p: micro's input of chunk `chunk` from the previous stage (allocates it)
  SendActs,        // p2p: micro's output of chunk `chunk` to the next stage (its last forward
                   // allocated it; the WaitP2P that sees the send done frees it)
  RecvGrads,       // p2p: the gradient of that output from the next stage (allocates it)
  SendGrads,       // p2p: the gradient of the chunk's input to the previous stage (freed as above)
  WaitP2P,         // compute waits for the p2p actions it lists
  BackwardWeight,  // compute: the zero-bubble split: the weight gradients an earlier Backward of
                   // (micro, chunk) deferred (Action::defer)
  SyncShared,      // reduce: unit u's reduced gradients summed with the other pipeline rank that
                   // holds it (GPT-2's tied embedding and head on the first and last stages)
  // Local SGD / DiLoCo (sharding/cross_group.h): the outer step of a round.
  OuterReduce,     // cross: unit u's pseudo-gradient (round start - now) averaged over the
                   // replica groups (allocates it)
  OuterUpdate,     // compute: the outer optimizer on the round's start with it; the replica's
                   // master set to the result (frees it)
  Count
};
const char* action_kind_name(ActionKind k);  // "gather", "wait_gather", "forward", ...
// The action of a unit's in-call tensor collective (TpGatherRows, TpScatterRows, TpAllGather).
ActionKind tensor_action_kind(TensorOp op);

// What a FetchState / EvictState moves (bits of Action::io).
enum IoPart : uint8_t {
  kIoMoments = 1,  // AdamW m and v (optimizer.bin)
  kIoMaster = 2,   // the fp32 master shard (params.bin)
  kIoGrads = 4,    // the reduced gradient shard (params.bin)
};

// What the planner knows of the memory of one schedule position's call (bytes).
struct CallMemory {
  int64_t saved = 0;        // Saved after a training forward
  int64_t saved_cheap = 0;  // of which Keep::Cheap (dropped under selective checkpointing)
  int64_t saved_eval = 0;   // the most its Saved holds during an inference call
  int64_t scratch = 0;      // the largest Scratch the call asks for (any of its phases, a full
                            // recompute's output included)
  bool known = false;       // the unit declared it (Unit::declare_activations)
  // Zero bubble: what a deferred backward keeps for its weight gradients until the
  // BackwardWeight (DeferredWeightGrads' copies of dout and inp; the planner measures it,
  // planner/pipeline.h; 0: not counted)
  int64_t deferred = 0;
  // Tensor parallelism: the collectives of each pass (Unit::Pass) of the call, in order.
  std::array<std::vector<TensorColl>, 5> tensor{};
};

// One unit as the plan sees it.
struct PlanUnit {
  std::string name;
  int64_t padded = 0;  // floats of the flat buffer (a multiple of S * kAlign)
  // Floats of it in 16-bit-only runs (FlatLayout::lp_only: ParamSpec::products_only), which
  // have no fp32 compute copy where units keep the 16-bit one (MixedPrecisionPolicy::weights16)
  int64_t lp_only = 0;
  // Floats of its Linear weights (ParamSpec::linear): what fp8.all_gather moves at one byte.
  int64_t linear = 0;
  int first_pos = -1, last_pos = -1;  // its first and last schedule positions (-1: not run)
  int bucket = -1;                    // NO_SHARD with replicas: its gradient bucket
  bool selective = false;  // Unit::selective_recompute(): Selective is not turned into Full
  bool optimizer_offloaded = false;  // its AdamW moments live on the host tier
  bool params_offloaded = false;     // its master (and reduced gradient) shard too
  bool optimizer_nvme = false;       // its AdamW moments live in the NVMe file
  bool params_nvme = false;  // its master and reduced gradient shards live in the NVMe file
  // Tensor parallelism: floats of its flat buffer in runs of replicated parameters (whose
  // gradients are summed over the tensor group: TpReduceGrads); 0: none.
  int64_t tp_replicated = 0;
};

// Bytes of a unit's full parameters (FlatUnit): the fp32 buffer and, with `w16`
// (MixedPrecisionPolicy::weights16), the 16-bit copy beside it, the fp32 one then compact.
int64_t full_params_bytes(const PlanUnit& u, bool w16);

// NO_SHARD with replicas: a contiguous range of the bucket buffer holding whole units'
// gradients, all-reduced once its last member finished its backward.
struct PlanBucket {
  int64_t lo = 0, hi = 0;    // floats
  std::vector<int> members;  // units, in backward-completion order
};

// How units keep their parameters (sharding/unit_state.h's FlatUnit::Kind).
enum class UnitKind : uint8_t { Sharded, FullReplicated, Whole };

// Everything plan_step reads. make_plan_input fills it from a model and a policy for any world
// size, so `shardwise plan-dump` and the planner see the plan a run of that size executes.
struct PlanInput {
  std::vector<Call> schedule;
  std::vector<PlanUnit> units;
  std::vector<PlanBucket> buckets;
  ShardingPolicy policy;
  int W = 1, S = 1, R = 1;  // world, shard group, replicas (S * R = W)
  // For the time model (planner/time_model.h TimeInputs): the hosts the run's ranks sit on, and
  // local SGD's replica groups (W is one replica's ranks then).
  int hosts = 1, replicas = 1;
  UnitKind kind = UnitKind::Sharded;
  // d_model: floats of the residual stream per token on this rank (Model::residual_width:
  // d_model / tensor with sequence parallelism).
  int B = 0, T = 0, d_model = 0;
  int tensor = 1;  // tensor-parallel degree (Model::tensor.size)
  int accum = 1;  // micro-steps per optimizer step
  std::vector<CallMemory> calls;  // per schedule position (empty: nothing declared)
  // Units whose gather is in flight when the plan starts. Empty: the steady state of a
  // training step (the previous step's optimizer prefetched the first forward_prefetch units).
  std::vector<bool> carried;
  // The previous optimizer step left its deferred updates (OptimizerOffload::defer_update;
  // see defers_update) to this micro-step: micro-step 0 runs them in its forward, each
  // unit's just before its first use. plan_step sets it for the steady state.
  bool pending = false;
  // The engine runs on a device (not the CPU). Its copies are asynchronous (copy streams):
  // activation offload to the host tier then frees an evicted call's device bytes once its
  // copy is seen done (after the next call's forward) and reads one call ahead, as offload to
  // a file does. The NVMe staging buffers are host memory (persistent_host).
  bool on_device = false;
  // The precision the units' matrix products compute in (their Ops' compute(); what their
  // activation declarations depend on, BatchShape::compute): make_plan_input takes the
  // policy's param_dtype, which is what the engine computes in unless it was handed Ops of
  // another precision (ShardedModel sets it from the Ops it runs).
  DType compute = DType::F32;
  // Per position: its call takes the residual stream as input (Model::takes_input) / is the
  // loss call (Model::is_loss). make_plan_input fills both.
  std::vector<uint8_t> takes_input, is_loss;
  // Pipeline parallelism (Model::stage): P ranks of `chunks` stages each; this rank's chunks'
  // first local positions (and the end), the schedule (pipeline_schedule.h's PipeSchedule)
  // and the units this rank shares with another pipeline rank (their gradients are summed
  // with it: SyncShared). accum is the number of micro-batches.
  struct Pipe {
    int size = 1, rank = 0, chunks = 1;
    int schedule = 0;  // PipeSchedule
    std::vector<int> chunk_begin;
    std::vector<int> first_stage_of_chunk;  // per chunk: its stage is the whole schedule's first
    std::vector<int> shared;                // local units held by another pipeline rank too
  } pipe;
  bool pipelined() const { return pipe.size > 1; }
};

// The flat sizes, groups and buckets of `model` sharded over `world` ranks with `policy` (whose
// shard_group_size must already be resolved for HYBRID_SHARD; 0 = the world). Throws
// sw::Error("sharding: ...") for an invalid schedule or group size.
PlanInput make_plan_input(const Model& model, const ShardingPolicy& policy, int world);

// policy.release_grads applies to unit u (ShardingPolicy::release_grads): its gradients are
// allocated by its first backward (a Whole unit's, Mem::Grads) or its first reduction (a
// sharded unit's reduced shard) of the step and freed by its optimizer update.
bool releases_grads(const PlanInput& in, int u);

// Fills in.calls from the units' declarations (Unit::declare_activations) for in.B x in.T.
void declare_calls(PlanInput& in, const Model& model);

using MemDeltas = std::array<int64_t, static_cast<size_t>(Mem::Count)>;


struct Action {
  ActionKind kind = ActionKind::Forward;
  Queue queue = Queue::Compute;
  int unit = -1;    // the unit it concerns (-1: none)
  int pos = -1;     // schedule position (Forward, DropSaved, Recompute, Backward)
  int call = -1;    // that position's call of the unit
  int bucket = -1;  // AllReduce of a NO_SHARD bucket
  int slot = -1;    // FetchState / EvictState: the staging buffer (ReduceScatter with NVMe
                    // parameters: the gradient staging buffer it accumulates into)
  uint8_t io = 0;   // FetchState / EvictState: IoPart bits
  // FetchState of an optimizer piece read across segments: in the last micro-step, the read is
  // issued and left in flight when the segment ends (it overlaps the forward and backward);
  // in the optimizer, the fetch adopts that read (its bytes are 0: counted where issued) or,
  // when there is none (no last micro-step ran since, or the state was written), reads.
  // EvictState of an optimizer piece of moments only: its write is left in flight when the
  // optimizer ends (it overlaps the next step); the next optimizer, or any access to the
  // moments outside the plan, waits for it first.
  bool carry = false;
  // FetchState with carry: this fetch adopts a read an earlier segment issued (its bytes are 0);
  // without adopt, a carried fetch is the one issued and left in flight.
  bool adopt = false;
  int64_t lo = 0, hi = -1;  // FetchState / EvictState / OptimizerUpdate: floats of the unit's shard
                            // (hi < 0: all of it)
  int micro = 0;    // micro-step of the optimizer step (the optimizer's actions: accum - 1)
  CheckpointMode mode = CheckpointMode::Off;  // DropSaved / Recompute
  int64_t bytes = 0;  // bytes a collective moves (its whole buffer in the wire dtype)
  int inside = -1;    // TpGatherRows / TpScatterRows / TpAllGather: the compute action it runs in
  int chunk = -1;     // pipeline: this rank's chunk (virtual stage) the action belongs to
  bool defer = false;  // Backward: its weight gradients wait for a BackwardWeight (zero bubble)
  // Bytes allocated (+) and freed (-) per category by this action. A reduction's completion
  // (freeing the transient gradients) is counted at the WaitReduce that observes it.
  MemDeltas mem{};
  // Bytes held only while the action runs (an inference call's Saved, cleared after it).
  MemDeltas transient{};
  std::vector<int> waits;  // indices of earlier actions this one waits for
};

// A contiguous part of a plan that one ShardedModel call runs.
// Pipeline: every micro-step of the step, as the pipeline schedule orders them (one call).
// Outer: local SGD's outer step (the units of one fragment, or all).
enum class SegmentKind : uint8_t { MicroStep, Optimizer, Eval, Pipeline, Outer };
struct Segment {
  SegmentKind kind = SegmentKind::MicroStep;
  int micro = 0;
  bool reduce = true;  // MicroStep: its backward reduces gradients (last micro-step, or
                       // reduce_each_micro_step)
  int begin = 0, end = 0;  // [begin, end) in actions
};

struct StepPlan {
  std::vector<Action> actions;
  std::vector<Segment> segments;
  // Memory that stays allocated across steps, per category (persistent model state, the
  // bucket buffer) and the step's workspace reserved once (the largest Scratch, the backward
  // ping-pong buffers): what the step's deltas start from.
  MemDeltas persistent{};
  MemDeltas persistent_host{};  // on the host tier (offloaded optimizer state)
  // On a device, the host updater's staging (Tier::Host, optimizer): the master and gradient
  // copies of at most two offloaded updates at once, held while they run, then cached by the
  // host pool. Part of the host figures (host_bytes).
  int64_t host_update_staging = 0;
  MemDeltas reserved{};
  int64_t scratch = 0;  // of reserved: the largest Scratch any call asks for (reserved once)
  int staging_slots = 0;       // NVMe optimizer offload: staging buffers (each staging_bytes)
  int64_t staging_bytes = 0;   // m and v (and master and gradient) of the largest piece
  int param_slots = 0;         // NVMe parameters: master staging for gathers (shard_bytes each)
  int grad_slots = 0;          // NVMe parameters: reduced-gradient staging (shard_bytes each)
  int64_t shard_bytes = 0;     // the largest NVMe-parameter unit's shard
  // Transient bytes already allocated when the plan starts (gathers carried from the previous
  // step's optimizer). A whole step's deltas bring every category back to this.
  MemDeltas initial{};
  int initial_gathered = 0;  // units whose gather is in flight at the start
  int W = 1, S = 1, R = 1;
  int tensor = 1;  // tensor-parallel degree (PlanInput::tensor)
  UnitKind kind = UnitKind::Sharded;
  bool activations_known = true;  // every call declared its activation memory
  std::vector<std::string> unit_names;

  // Bytes the run keeps in its NVMe files per rank: moments, master + gradient shards, and
  // the most activations one micro-step writes (4096-byte alignment of regions not counted).
  int64_t nvme_bytes = 0;

  // A readable listing: one line per action (index, queue, kind, unit, bytes, waits, memory).
  std::string str() const;
  // Most units whose transient parameters are allocated at once (what max_live_units caps).
  int peak_gathered_units() const;
};

// The plan replayed without running the model: the device's memory (persistent + reserved +
// what the actions allocate and free) at every action, and where its total peaks. Kernel
// workspaces that units do not declare (core/alloc.h Mem::Workspace outside Scratch) are not
// in the plan, so the measured total can exceed it by those.
struct PlanPeak {
  int64_t total = 0;        // the largest device total
  int action = -1;          // the action after which it is reached (-1: before any)
  MemDeltas at_peak{};      // bytes per category at that moment
  MemDeltas category_peak{};  // each category's own peak (not simultaneous)
  bool negative = false;    // a category went below zero: the plan is inconsistent
};
PlanPeak replay_peak(const StepPlan& plan);
// The host-tier bytes a step holds at most: persistent_host plus the host updater's staging.
int64_t host_bytes(const StepPlan& plan);

// Training: the accum micro-steps, then the optimizer, of a step in the steady state (units the
// previous step's optimizer prefetched are in flight when it starts). Eval: one forward.
StepPlan plan_step(const PlanInput& in);
StepPlan plan_eval(const PlanInput& in);
// Pipeline parallelism: the pipeline segment (every micro-batch's chunks on this rank, in the
// schedule's order, sends and receives included, gradients reduced at each unit's last
// backward) and the optimizer; plan_step of a pipelined input is this.
StepPlan plan_pipeline_step(const PlanInput& in);
StepPlan plan_pipeline(const PlanInput& in);  // the pipeline segment alone
// Local SGD / DiLoCo: the outer step of the units `units` marks (outer_bytes: the wire bytes of
// a float of the pseudo-gradient), or one phase of it: the reduces alone (issued, not waited
// for) or the updates alone (each waits for its unit's reduce, issued by an earlier plan).
StepPlan plan_outer(const PlanInput& in, const std::vector<bool>& units, double outer_bytes = 4,
                    OuterPhase phase = OuterPhase::Both);
// The parts the executor runs, one per ShardedModel call: one micro-step's forward and
// backward (`reduce`: its backward reduces the gradients; `last`: the step's last, which also
// starts the reads of the optimizer's first pieces, see Action::carry), starting with
// in.carried in flight (empty: none); the optimizer update. plan_step concatenates them.
StepPlan plan_micro_step(const PlanInput& in, int micro, bool reduce, bool last);
StepPlan plan_optimizer(const PlanInput& in);
// With deferred updates (defers_update(in)): the optimizer segment updates only the units
// whose update is not deferred, and plan_flush is the segment that applies the deferred ones
// outside a micro-step (before evaluation, checkpoints, export). Empty when nothing defers.
bool defers_update(const PlanInput& in);
bool unit_defers(const PlanInput& in, int u);  // unit u's update is deferred
StepPlan plan_flush(const PlanInput& in);
// The units the optimizer leaves in flight for the next step (its prefetches).
std::vector<bool> optimizer_prefetched(const PlanInput& in);

// The executor's record of one action (the profiler's timeline). Times are seconds on
// trace_clock(); an asynchronous action (a collective) ends when its completion is observed.
struct ActionRecord {
  int action = -1;  // index in the plan (-1: a host updater job, queue Host)
  int segment = -1;
  ActionKind kind = ActionKind::Forward;
  Queue queue = Queue::Compute;
  int unit = -1, call = -1, micro = 0, bucket = -1;
  int chunk = -1;  // pipeline: the chunk (virtual stage) of the action
  int64_t bytes = 0;
  double t_begin = 0, t_end = 0;
  int issued = -1;  // a reduction: the order this rank issued it in (StepRecorder::issued)
  // Settled with a device interval (ActionRecords::settle_device_times): the stream that ran
  // the action's work ("cuda compute", "nccl", "copy h2d", ...) and [t_begin, t_end] its
  // interval there; host_begin/host_end the times the record had before (the host's issue).
  // Null: t_begin/t_end are the host's.
  const char* stream = nullptr;
  double host_begin = 0, host_end = 0;
};
double trace_clock();  // steady clock, seconds

// Where the executor writes its records while set (ShardedModel::set_recorder). Segments are
// numbered in the order they ran since the recorder was attached.
struct StepRecorder {
  std::vector<ActionRecord> records;
  int segments = 0;
  int issued = 0;  // reductions (reduce-scatters and all-reduces) issued since it was attached
};

}  // namespace sw
