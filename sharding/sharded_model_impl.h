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
#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/worker.h"
#include "sharding/sharded_model.h"
#include "sharding/io_stream.h"
#include "sharding/step_plan.h"
#include "sharding/unit_state.h"

namespace sw {

// A reduction of the reduce queue, issued (HYBRID's all-reduce starts once the reduce-scatter
// before it has completed).
struct PendingReduction {
  int action = -1;  // in the plan being run
  ActionKind kind = ActionKind::ReduceScatter;
  int unit = -1, bucket = -1;
  bool finishes = true;  // its completion finishes the unit's reduction (accumulate)
  int seq = -1;          // ActionRecord::issued (with a recorder)
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
  double* loss_total = nullptr;  // ctx.loss_total: a zeroed double of the device
  double loss_sum = 0;
  int64_t loss_count = 0;
  const float* x = nullptr;   // forward: the input of the next call
  const float* dy = nullptr;  // backward: dy of the next call
  bool dy16 = false;          // backward: Impl::grad16 holds narrow(dy) (UnitCtx::grad16)
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
  // Per staging slot: a read the last micro-step issued for the optimizer (Action::carry),
  // what it reads and its event; empty when none is pending.
  struct Carried {
    int unit = -1;
    int64_t lo = 0, hi = 0;
    IoEventPtr ev;
  };
  std::vector<Carried> carried;
  // Waits for the carried reads and forgets them (their staging data would be stale after a
  // write of the moments outside the plan).
  void drop_carried();
  // The optimizer's write-backs left in flight past its segment (an Evict with Action::carry):
  // they overlap the next step's forward and backward. settle_writes() waits for them and
  // throws the first one's io error line; it runs before the next optimizer segment and
  // before any access to the moments outside the plan (checkpoints).
  std::vector<IoEventPtr> pending_writes;
  void settle_writes();
  int64_t tracked = 0;                // bytes reported to the NVMe tier's tracker (Optimizer)
  IoStream io;
  ~NvmeMoments();                     // closes and removes the file (a clean exit)
};

// NVMe parameters (sharding/policy.h ParamOffload): every unit's master shard and reduced
// gradient shard in one file per rank (unit u: master at moff[u], gradients at goff[u], both
// 4096-aligned). Gathers read the master into `pslots` ahead of time (the plan's Fetch before
// each Gather); reductions accumulate into `gslots` and write them back; the optimizer streams
// pieces through NvmeMoments-style staging (`opt_slots` when the moments are not on NVMe).
struct NvmeParams {
  std::string dir, path;
  AioFile file;  // attached to `io`: O_DIRECT for aligned pieces (large staging is page-aligned)
  int fd = -1;   // file.fd(): the buffered descriptor
  std::vector<int64_t> moff, goff;  // per unit; -1: not in the file
  std::vector<Buffer> pslots, gslots;
  std::vector<Buffer> opt_slots;    // the optimizer's staging when NvmeMoments has none
  std::vector<IoEventPtr> gbusy;    // per gradient slot: its last write (reused after it)
  // Per parameter slot: the upload its gather made from it; the next read into the slot waits
  // for it in the io queue (on a device the upload is asynchronous).
  std::vector<std::shared_ptr<Event>> pbusy;
  std::vector<IoEventPtr> gfetch;   // per unit: the read its next accumulation waits for
  std::vector<double> sumsq;        // per unit: sum of squares of the accumulated gradients
  Buffer tmp;                       // synchronous accesses (init, export, checkpoints)
  int64_t tracked_master = 0, tracked_grads = 0;  // reported to the NVMe tier's tracker
  std::vector<std::vector<IoEventPtr>> ev;  // per action of the segment being run
  // One io queue per rank: NvmeMoments' when it exists, so that staging reuse is ordered.
  std::unique_ptr<IoStream> own_io;
  IoStream* io = nullptr;
  ~NvmeParams();                    // closes and removes the file (a clean exit)
  // `tmp` holding at least `floats` (grown, never shrunk until released).
  float* scratch(int64_t floats, const Device& dev);
  // Synchronous transfer of n floats at byte offset `off` (throws the io error line).
  void transfer(float* buf, int64_t n, int64_t off, bool write);
};

// Activation offload to NVMe (activation_checkpointing.offload = nvme): one file per rank; an
// evicted position's buffers (its input, then its Saved in Saved::detach order) are written
// contiguously from `off[pos]` and kept in `writing` until the plan's WaitIo sees the write
// done; a fetch allocates them again and reads them back.
struct NvmeActs {
  explicit NvmeActs(const AioConfig& cfg) : io(cfg) {}
  std::string dir, path;
  AioFile file;
  int fd = -1;
  int64_t reserved = 0;  // bytes of the file reserved so far (the NVMe tracker's Activations)
  int64_t next = 0;      // where the next evicted position goes (from 0 each micro-step)
  std::vector<int64_t> off;               // per position
  std::vector<size_t> act_bytes;          // per position: its input's bytes (0: none)
  std::vector<std::vector<Buffer>> writing;  // per position: buffers being written
  // On a device the file is read and written through host copies: per Fetch action of the
  // segment, the host buffers read into and the device buffers they go to at its WaitIo.
  std::unordered_map<int, std::vector<std::pair<Buffer, Buffer*>>> reading;
  std::vector<std::vector<IoEventPtr>> ev;   // per action of the segment being run
  IoStream io;
  ~NvmeActs();  // closes and removes the file
};

struct HostCopyQueue;  // sharding/optimizer.cpp

struct ShardedModel::Impl {
  const Ops* ops = nullptr;          // utilities and the optimizer (fp32)
  const Ops* compute_ops = nullptr;  // what units run with: ops_for(device, param_dtype)
  ShardingPolicy policy;
  // world: the group given at construction; shard, rep: the groups of the unit buffers'
  // collectives (on a device, device_group()s of shard_host and the replicate group);
  // shard_host: the shard group over the host, for host scalars (grad_norm). rep: null when
  // R == 1.
  GroupPtr world, shard, rep, shard_host;
  // A batch on the device (its tokens and targets copied there), for a non-CPU device.
  Buffer batch_tokens, batch_targets;
  // Their host copies (on_device): per input a ring of kBatchRing, each with the upload from
  // it in flight, so the host waits only for the upload kBatchRing micro-steps back.
  static constexpr int kBatchRing = 3;
  struct Upload {
    Buffer host;
    std::shared_ptr<Event> done;
  };
  Upload batch_ring[2][kBatchRing];
  int batch_next = 0;  // the ring entry the next batch uses
  Batch dev_batch;
  const Batch& on_device(const Batch& b);
  // Losses (micro_step, step_losses): each micro-step adds its sum of token losses into a
  // double of `sums` (ops' device; ctx.loss_total), zeroed when the micro-step starts, so the
  // host reads nothing then. Layout: [kLossSlots micro-steps | the gradient norm's per-unit
  // sums | kLossSlots eval batches]. The unread micro-steps are slots [0, unread); one copy
  // brings them
  // to the host, with the norm's sums when grad_norm reads (read_sums). `losses` holds each
  // micro-step since the last step_losses: what units reported on the host (ctx.loss_sum),
  // the targets counted, and, once read, the device's sum added.
  static constexpr int kLossSlots = 64;
  struct StepLoss {
    double sum = 0;
    int64_t count = 0;
  };
  Buffer sums;
  std::vector<StepLoss> losses;
  int unread = 0;
  double* sum_at(int i);  // sums' double i (allocated on first use)
  // Copies sums [0, kLossSlots + k) to the host (one synchronisation), adds the unread
  // slots into `losses` and returns the k norm sums.
  std::vector<double> read_sums(int k);
  // Evaluation (eval_step, eval_losses) the same way: each batch's sum of token losses into
  // an eval slot of `sums` (up to kLossSlots unread: then they are read, one copy), with what
  // units reported on the host and the targets counted in `eval_pending`; read_evals turns
  // them into mean losses in `eval_done`.
  std::vector<StepLoss> eval_pending;
  std::vector<double> eval_done;
  double* eval_at(int i) { return sum_at(kLossSlots + static_cast<int>(units.size()) + i); }
  void read_evals();
  int W = 1, S = 1, R = 1;
  std::vector<std::unique_ptr<FlatUnit>> units;
  // offload_optimizer cpu on a device: the host thread the CPU's AdamW runs on while the
  // device goes on (update_on_host), made on first use. Declared after `units`, so it is
  // joined (its jobs run out) before the units' buffers go. SHARDWISE_HOST_UPDATE_ASYNC=0 waits
  // for each update where it is issued (the synchronous split, for comparison).
  // host_update_seconds: added to by the updater's jobs (declared before host_updater, which
  // runs what is left of them when it goes).
  std::atomic<int64_t> host_update_ns{0};
  // The posted updates whose copies down are not issued yet (optimizer.cpp).
  std::shared_ptr<HostCopyQueue> host_copies;
  // Host updater jobs issued while a recorder was set, as they ran (the job fills one in when
  // it ends); run() moves the finished ones into the recorder as Queue::Host records, at the
  // start and end of every segment, so a step's updates appear in the segments they overlap.
  struct HostSpans {
    std::mutex mu;
    std::vector<ActionRecord> done;
  };
  std::shared_ptr<HostSpans> host_spans = std::make_shared<HostSpans>();
  void take_host_spans();
  std::unique_ptr<HostWorker> host_updater;
  const bool host_update_sync = env_switched_off("SHARDWISE_HOST_UPDATE_ASYNC");
  // Tests: SHARDWISE_HOST_UPDATE_DELAY_US=N sleeps N us before each host update, so a unit
  // touched before its update settled reads stale values and the comparison fails.
  int host_update_delay_us = 0;
  // Global parameter name -> (unit, spec index).
  std::unordered_map<std::string, std::pair<int, int>> by_name;

  // What plans are built from (sizes, groups, buckets); B, T and carried set per plan.
  PlanInput plan_in;
  std::map<std::string, StepPlan> plans;  // by (segment, batch shape, carried units)
  StepPlan opt_plan;                       // the optimizer segment (shape-independent)
  // OptimizerOffload::defer_update: the segment applying the deferred updates on their own
  // (flush_deferred), the last optimizer_step's arguments while its deferred updates wait
  // for the next micro-step, and the units whose gradients zero_grads left for after it.
  StepPlan flush_plan;
  struct DeferredStep {
    AdamWParams adam;
    float lr = 0.f, grad_mult = 1.f;
    int step = 0;
  };
  std::optional<DeferredStep> deferred;
  std::vector<bool> defers;  // per unit: unit_defers(plan_in, u), fixed at construction
  std::vector<bool> zero_after_update;

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
  // Backward's residual gradient in the compute precision (B*T*d 16-bit values, UnitCtx::grad16)
  // where the Ops prefer 16-bit operands and compute products in 16 bits; empty elsewhere.
  Buffer grad16;

  // gather_full_params: per unit, the gathered parameters (empty on ranks other than 0 with
  // rank0_only).
  std::vector<Buffer> summoned;
  bool summon_held = false, summon_rank0_only = false;

  std::unique_ptr<NvmeMoments> nvme;  // null unless some unit's moments live on NVMe
  std::unique_ptr<NvmeParams> pnvme;  // null unless the parameters live on NVMe
  std::unique_ptr<NvmeActs> anvme;    // activation offload to NVMe (made at the first evict)
  // Activation offload to the host tier on a device (plan_in.on_device): per plan action
  // (an Evict or Fetch of this segment) its copies in flight and, index for index, the
  // buffers they copy from, kept until the WaitIo that sees them done. A device buffer goes
  // once the compute stream has waited for its copy; a host buffer once the host sees its
  // copy complete (copied_host holds it until then).
  struct CopiesInFlight {
    std::vector<std::shared_ptr<Event>> ev;
    std::vector<Buffer> from;
  };
  std::unordered_map<int, CopiesInFlight> act_copies;
  std::vector<std::pair<std::shared_ptr<Event>, Buffer>> copied_host;
  // copied_host: releases the buffers whose copy is complete (wait: all, waiting for them).
  void release_copied(bool wait);
  // Waits for every activation copy in flight and releases what they copied from.
  void settle_act_copies() noexcept;
  int rank = 0;

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
  const StepPlan& plan_for(const Model& model, const Batch& batch, SegmentKind kind, bool reduce,
                           bool last, bool pending = false);
  // Runs every action of `plan` in order.
  void run(Model& model, const StepPlan& plan, ExecState& st);
  // One action, and with a recorder on a device stream, its device-side interval (below).
  void run_action(Model& model, const StepPlan& plan, int i, ExecState& st);
  void run_action_body(Model& model, const StepPlan& plan, int i, ExecState& st);
  // The device timeline of the recorded compute-queue actions. On a device stream (or with
  // SHARDWISE_PROFILE_DEVICE_TIMES=1) each such action is bracketed by two timed events on the
  // compute stream (Stream::record_timed), and settle_device_times() replaces the record's
  // host times (when the host issued it) with the device's (when the stream ran it):
  // device_ref_host + seconds since device_ref, an event the host waited for (once per
  // settle) to tie the two clocks. Settled before the records are read or the recorder goes.
  struct DeviceSpan {
    size_t record = 0;        // index in recorder->records
    int action = -1, segment = -1;  // that record's (checked: the records may have been taken)
    std::shared_ptr<Event> begin, end;
  };
  bool device_times = false;  // set with the recorder
  std::vector<DeviceSpan> device_spans;
  std::shared_ptr<Event> device_ref;
  double device_ref_host = 0;
  void settle_device_times();
  // HYBRID's all-reduce of a unit's reduced block (r, pushed onto `pending`): issued right
  // behind the unit's reduce-scatter, the newest pending entry, to start once that has
  // completed (Group::issue_all_reduce_after; the host does not wait). So every rank issues
  // the two groups' collectives in plan order whatever the timing, as NCCL requires of
  // communicators that run at once (until 2026-11-28 the host issued it once it saw the
  // reduce-scatter done, an order that depended on each rank's timing).
  void issue_follow_up(FlatUnit& fu, PendingReduction& r);
  // The next reduction's ActionRecord::issued (-1 without a recorder).
  int next_seq() { return recorder ? recorder->issued++ : -1; }
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
  // NVMe io: issues io action i (Fetch / Evict of moments, master, gradients); waits for the
  // events of io action w (recording it as an io-queue action when `rec`).
  void run_io(const StepPlan& plan, int i, FlatUnit& fu);
  int run_carried(const StepPlan& plan, int i);  // a Fetch with Action::carry (executor.cpp)
  // Activation offload to NVMe: the write (Evict) or read (Fetch) of position a.pos.
  void run_act_io(const StepPlan& plan, int i);
  // Creates the file on first use and makes sure `bytes` from `off` are reserved in it (the
  // free-space check and posix_fallocate; sw::Error naming the path otherwise).
  void reserve_acts(int64_t end);
  void wait_io(const StepPlan& plan, int w, bool rec = true);
  // Applies the deferred updates now (flush_plan) and zeroes the gradients zero_grads left
  // for after them: before anything reads or writes parameters or optimizer state outside
  // a micro-step. A no-op when none is pending.
  void flush_deferred(Model& model);
  void set_deferred(ExecState& st) const;  // st's optimizer arguments from `deferred`
  // Whether WaitReduce i ends the micro-step's backward (only io write-back follows it).
  static bool ends_backward(const StepPlan& plan, int i);

  // ---- optimizer.cpp -----------------------------------------------------------------------
  // AdamW on floats [lo, hi) of this rank's slice (the whole slice unless NVMe streams it in
  // pieces); the unit's once-per-update work comes with the piece that ends the slice.
  void update_unit(FlatUnit& fu, const ExecState& st, int64_t lo, int64_t hi);
  // update_unit for a unit whose moments are in host memory while it lives on a device.
  void update_on_host(FlatUnit& fu, const ExecState& st, int64_t lo, int64_t hi);
  // FlatUnit::accumulate_reduced for a gradient shard on the host while the unit lives on a
  // device (offload_param cpu): the reduced block goes down on the copy stream and the host
  // updater adds it, so neither the host nor the device waits for the other here.
  void accumulate_on_host(FlatUnit& fu);
  // The host updater, made on first use.
  HostWorker& updater();
  // Creates the NVMe moments file (zeros) after checking the room it needs (sw::Error naming
  // nvme_path otherwise) and the staging buffers.
  void setup_nvme(int rank);
  // NVMe parameters: creates params.bin (after the free-space check) and the staging buffers.
  void setup_nvme_params(int rank);
  // The staging of the optimizer's piece in slot `slot` (NvmeMoments' or NvmeParams').
  float* opt_slot(int slot);
  // Stages unit u's master (and gradient) shard from the file into pnvme->tmp for an access
  // outside the plan; unstage() writes the master back when `dirty`.
  void stage_whole(FlatUnit& fu, bool grads);
  void unstage_whole(FlatUnit& fu, bool write_master);
  // A reduction of an NVMe-parameter unit completing outside the plan (sync_grads): reads,
  // accumulates and writes its gradients synchronously.
  void accumulate_nvme(FlatUnit& fu);
};

}  // namespace sw
