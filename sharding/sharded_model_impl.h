// ShardedModel's state (internal to sharding/). The files that work on it, one concept each:
//   sharded_model.cpp  construction, groups, initialisation, parameter access
//   step_plan.cpp      what a step does, as data (plan_step and its parts)
//   executor.cpp       runs a plan's actions: gathers, compute, frees, reductions, records
//   optimizer.cpp      gradient norm, zeroing, the AdamW update segment
//   state_access.cpp   checkpoint access to the flat state (owned / held ranges)
// sharding/unit_state.h holds the per-unit state machine and memory roles.
//
// Groups: a world group of W ranks is seen as S-rank shard groups times R-rank replicate
// groups (S * R = W). FULL_SHARD / SHARD_GRAD_OP / SHARD_OPTIMIZER: S = W, R = 1. NO_SHARD:
// S = 1, R = W. HYBRID_SHARD: S = shard_group_size (consecutive ranks), R = W / S.
// Parameters are sharded over the shard group; gradients are reduce-scattered (averaged) over
// it, then all-reduced (averaged) over the replicate group. With S = 1 there is nothing to
// scatter: gradients are all-reduced in place, in buckets (DDP).
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "sharding/sharded_model.h"
#include "sharding/io_stream.h"
#include "sharding/step_plan.h"
#include "sharding/unit_state.h"

namespace sw {

// A reduction of the reduce queue (issued, or waiting for the one before it to complete).
struct PendingReduction {
  int action = -1;  // in the plan being run
  ActionKind kind = ActionKind::ReduceScatter;
  int unit = -1, bucket = -1;
  bool issued = false;
  bool finishes = true;  // its completion finishes the unit's reduction (accumulate)
  int64_t bytes = 0;
  double t_issue = 0;
  Work work;
};

// What a running segment carries from one action to the next.
struct ExecState {
  const Batch* batch = nullptr;
  bool training = true;
  float scale = 0.f;  // ctx.grad_scale
  float* logits = nullptr;
  double loss_sum = 0;
  int64_t loss_count = 0;
  const float* x = nullptr;   // forward: the input of the next call
  const float* dy = nullptr;  // backward: dy of the next call
  int cur = 0;                // backward: the ping-pong buffer the next dx goes to
  // The optimizer segment.
  const AdamWParams* adam = nullptr;
  float lr = 0.f, grad_mult = 1.f;
  int step = 0;
};

// NVMe optimizer offload (sharding/policy.h OptimizerOffload): the AdamW moments of the
// offloaded units in one file per rank; unit u's region starts at offset[u] (bytes, a multiple
// of 4096) and holds its shard in pieces of OptimizerOffload::piece_floats, each piece m then
// v. The optimizer segment's Fetch / Evict actions stage pieces through `slots` on `io`, whose
// engine (policy.aio) sends the aligned part of each piece through the file's O_DIRECT
// descriptor (`file` is attached to `io`) and the rest, like checkpoint access, through `fd`.
struct NvmeMoments {
  explicit NvmeMoments(const AioConfig& cfg) : io(cfg) {}
  std::string dir, path;
  AioFile file;                       // O_DIRECT where the filesystem accepts it
  int fd = -1;                        // file.fd(): the buffered descriptor
  std::vector<int64_t> offset;        // per unit; -1: not in the file
  std::vector<StagingBuffer> slots;   // staging, 4096-aligned, Mem::Optimizer
  Buffer view;                        // checkpoint reads (state_view)
  std::vector<IoEventPtr> ev;         // per action of the segment being run
  IoStream io;
  ~NvmeMoments();                     // closes and removes the file (a clean exit)
};

struct ShardedModel::Impl {
  const Ops* ops = nullptr;          // utilities and the optimizer (fp32)
  const Ops* compute_ops = nullptr;  // what units run with: ops_for(device, param_dtype)
  ShardingPolicy policy;
  GroupPtr world, shard, rep;  // rep: null when R == 1
  int W = 1, S = 1, R = 1;
  std::vector<std::unique_ptr<FlatUnit>> units;
  // Global parameter name -> (unit, spec index).
  std::unordered_map<std::string, std::pair<int, int>> by_name;

  // What plans are built from (sizes, groups, buckets); B, T and carried set per plan.
  PlanInput plan_in;
  std::map<std::string, StepPlan> plans;  // by (segment, batch shape, carried units)
  StepPlan opt_plan;                       // the optimizer segment (shape-independent)

  // S == 1 and R > 1: every unit's gradients in one buffer (plan_in.buckets' ranges).
  Buffer bucket_buf;
  std::deque<PendingReduction> pending;

  // Per schedule position: the input activation x of that call (B*T*d floats,
  // Mem::Activations; empty for position 0, whose embedding ignores x) and its Saved.
  std::vector<Buffer> acts;
  std::vector<Saved> saved;
  // Per schedule position: how backward must rebuild its Saved (activation checkpointing;
  // Off: forward's Saved was kept).
  std::vector<CheckpointMode> recompute;
  Scratch scratch;
  // Ping-pong (B*T*d) buffers, kept across steps: backward's dy/dx (dy of one call is dx of
  // the next) and inference's residual stream.
  Buffer dbuf[2];

  // gather_full_params: per unit, the gathered parameters (empty on ranks other than 0 with
  // rank0_only).
  std::vector<Buffer> summoned;
  bool summon_held = false, summon_rank0_only = false;

  std::unique_ptr<NvmeMoments> nvme;  // null unless some unit's moments live on NVMe

  int peak_live = 0;  // peak_gathered_units()
  StepRecorder* recorder = nullptr;
  int exec_delay_us = 0;  // SHARDWISE_EXEC_DELAY_US: random sleep before each action
  uint64_t delay_state = 0;

  ~Impl() { quiesce(); }

  FlatUnit& unit_at(const Model& m, size_t pos) {
    return *units[static_cast<size_t>(m.schedule[pos].unit)];
  }
  int live_units() const {
    int n = 0;
    for (const auto& u : units) n += u->holds_gathered();
    return n;
  }
  void issue(FlatUnit& fu) {
    fu.issue_unshard();
    peak_live = std::max(peak_live, live_units());
  }
  void ensure_pingpong(size_t n);
  void free_activations();

  // ---- executor.cpp ------------------------------------------------------------------------
  // The plan of a micro-step (training) or an eval forward for this batch shape, starting from
  // the units in flight now.
  const StepPlan& plan_for(const Model& model, const Batch& batch, SegmentKind kind, bool reduce);
  // Runs every action of `plan` in order.
  void run(Model& model, const StepPlan& plan, ExecState& st);
  void run_action(Model& model, const StepPlan& plan, int i, ExecState& st);
  // Issues the follow-ups (HYBRID's all-reduces) whose reduce-scatter has completed. Never
  // blocks, never frees.
  void issue_follow_ups();
  // Completes reductions in queue order up to plan action `through` (-1: all), accumulating
  // the reduced gradients (which frees the transient ones).
  void complete_reductions(int through);
  // Reduces every gradient not reduced yet (reduce_once without a last micro-step, units
  // outside the schedule) and waits for all reductions.
  void sync_grads();
  void reduce_unit_now(FlatUnit& fu);  // sync_grads' reductions, outside any plan
  void issue_bucket(int bi, int action);
  void quiesce() noexcept;
  void abandon_step();
  CheckpointMode checkpoint(const Model& m, size_t p);
  void rebuild(Model& model, const Batch& batch, size_t q, float scale);
  UnitCtx ctx_for(FlatUnit& fu, const Batch& batch, int pos, bool training);
  void record(const StepPlan& plan, int i, double t0, double t1);

  // ---- optimizer.cpp -----------------------------------------------------------------------
  // AdamW on floats [lo, hi) of this rank's slice (the whole slice unless NVMe streams it in
  // pieces); the unit's once-per-update work comes with the piece that ends the slice.
  void update_unit(FlatUnit& fu, const ExecState& st, int64_t lo, int64_t hi);
  // Creates the NVMe moments file (zeros) after checking the room it needs (sw::Error naming
  // nvme_path otherwise) and the staging buffers.
  void setup_nvme(int rank);
};

}  // namespace sw
