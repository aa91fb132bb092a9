// One unit's sharded state (internal to sharding/): its flat layout, the memory of each role,
// and the state machine of FSDP2's FSDPParamGroup, with named states and guarded, idempotent
// transitions. ShardedModel (sharded_model.cpp) decides WHEN to call them; this file says
// WHAT each transition does.
//
// Memory of one unit (S = ranks in the shard group, "shard" = padded / S floats). Columns:
// A = sharded unit (S > 1, stages 2/3, HYBRID), B = stage 1 (S > 1), C = S == 1 (NO_SHARD,
// world 1).
//   role             A                                   B                   C
//   master           own buffer (shard), Params          view into full      = full
//   full params      transient (padded), Communication   persistent, Params  persistent, Params
//   unsharded grads  transient (padded), Communication   persistent, Grads   own or bucket, Grads
//   reduced grads    own buffer (shard), Grads           own buffer, Grads   = unsharded grads
//   AdamW m, v       own buffers (shard), Optimizer      same                (padded), Optimizer
// "Transient" buffers exist only between the transitions that allocate and free them, so a
// rank's persistent model state (Params + Grads + Optimizer) is 16 bytes per parameter / S;
// gathered parameters and gradients awaiting their reduce-scatter are Communication.
//
// Mixed precision (MixedPrecisionPolicy, sharding/policy.h). Master shards, reduced gradients
// and AdamW moments stay fp32; the full parameters the unit computes with hold values exactly
// representable in param_dtype (the rounding of the masters), still stored as fp32.
//   param_dtype != F32, kind A: each rank rounds its master shard into its slot of the FRONT
//     half of the (padded) full buffer and the all-gather runs in place there in param_dtype
//     (half the bytes of fp32); wait_unshard then widens the gathered values to fp32 in
//     place, from the back. No memory beyond the fp32 full buffer.
//   param_dtype != F32, kinds B and C: the master can no longer be (a view into) the full
//     buffer, which must hold rounded values: the master gets its own buffer (B: shard, C:
//     padded; Params) and the full buffer becomes the compute copy (persistent, Params).
//     Extra memory: C: +4 bytes per parameter (the master copy); B: +4 bytes per parameter / S.
//     Kind B refreshes the copy by the in-place param_dtype all-gather above after each
//     optimizer step; kind C re-rounds it from the master (no communication).
//   16-bit copy (MixedPrecisionPolicy::weights16: param_dtype != F32 on a device): beside the
//     fp32 full buffer, every kind keeps the same values 16-bit (params16(), UnitCtx.params16),
//     which the matrix products read instead of narrowing the weights on each call. Kind A:
//     the all-gather runs into it (transient, Communication: 6 bytes per parameter with the
//     fp32 buffer) and wait_unshard widens it into the fp32 buffer, out of place. Kind B: the
//     same, persistent (Params). Kind C: persistent (Params), written with the compute copy
//     by the update itself where the master is on the device (Ops::adamw_copies,
//     Updates::update, sharding/updates.cpp), else from the master in one pass after it
//     (issue_regather), and by finish_init and write_compute, so no writer of the compute
//     copy leaves it stale. +2 bytes per parameter in each case.
//     Parameters read only by matrix products (ParamSpec::products_only) then have no fp32
//     compute copy: the fp32 buffer is compact (FlatLayout::runs, f32_floats()) and holds the
//     other parameters only (params()[s] is null for them; the products read params16()).
//     A gather widens the fp32 runs only; kind C narrows the master into the 16-bit-only
//     runs. -4 bytes per such parameter (GPT-2's and the Llama's blocks: all but norms and
//     biases).
//   fp8 all-gather (MixedPrecisionPolicy::fp8_all_gather; kind A with the 16-bit copy, on the
//     CPU): each rank's slot carries its slice of the 16-bit-only parameters (the products'
//     weights) as E4M3 bytes, q = fp8(bf16(master) * s) with one power-of-two scale s per
//     tensor from the whole tensor's amax (a small all-reduce of the slices' amaxes at issue),
//     and the rest as bf16. The slots are gathered into the 16-bit copy itself (a slot holds
//     at most 2 bytes a value, so they fit) and unpacked in place: the bf16 values widened
//     into the fp32 buffer first, then the bytes decoded to q / s (exact in bf16) from the
//     last value to the first (a value's byte never lies above its 16-bit slot, so nothing
//     unread is overwritten), then the bf16 values narrowed back. The weights then hold the
//     values the fp8 products quantise them to (with power-of-two scales, that quantisation
//     reproduces q exactly), so training is bit-identical to the bf16 gather's.
//   reduce_dtype != F32: kinds A and B divide the unsharded gradients by the world size,
//     narrow them in place (front half of their buffer) and sum them by reduce-scatter
//     (HYBRID: then all-reduce) in reduce_dtype; the reduced block is widened and added into
//     the fp32 reduced gradients. Kind C with replicas
//     (NO_SHARD) does the same per bucket; kind C alone rounds its gradients to reduce_dtype
//     at the same point, so fp16 overflow shows up alike at any world size.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/alloc.h"
#include "models/unit.h"
#include "sharding/comm/group.h"
#include "sharding/comm/p2p.h"
#include "sharding/comm/quantize.h"
#include "sharding/flat_param.h"
#include "sharding/policy.h"
#include "sharding/unit_grads.h"

namespace sw {

// Where a unit's parameters are. Sharded: only the master shard is valid (a gather may be in
// flight); Unsharded: the full buffer is valid and may be handed to the unit.
enum class ShardedState : uint8_t { Sharded, Unsharded };
// Where the unit is in the current step: Idle (between steps), Forward (its forward calls have
// started), PreBackward (its backward calls have started), PostBackward (its last backward call
// is done; its gradients are complete for this micro-step and may be reduced).
enum class TrainingState : uint8_t { Idle, Forward, PreBackward, PostBackward };
const char* sharded_state_name(ShardedState s);
const char* training_state_name(TrainingState s);

// A half-open float range [lo, hi) inside a unit's flat buffer.
struct Range {
  int64_t lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
};
inline Range intersect(Range a, Range b) { return {std::max(a.lo, b.lo), std::min(a.hi, b.hi)}; }

// Precision conversions of the mixed-precision paths are Ops (kernels/ops.h narrow, widen,
// add_widened, round_to), so they run where the buffers are.

class FlatUnit {
 public:
  enum class Kind : uint8_t {
    Sharded,         // S > 1, stages 2/3 and HYBRID: everything unsharded is transient
    FullReplicated,  // S > 1, stage 1: full params and grads persistent, optimizer sharded
    Whole,           // S == 1: the shard is the whole buffer
  };

  // Allocates the persistent buffers (zeroed). `bucket_grads`: for Kind::Whole, the unit's
  // region of the model's bucket buffer (padded floats), or null to allocate its own.
  // `opt_tier`: where the AdamW moments live (Tier::Host: offloaded, outside the device's
  // budget; sharding/policy.h OptimizerOffload). `param_tier`: where a Kind::Sharded unit's
  // master shard and reduced gradient shard live (ParamOffload). `release_grads`
  // (ShardingPolicy::release_grads, where step_plan.h's releases_grads says it applies: a
  // Whole unit's own buffer, a Sharded unit's reduced shard on the device tier): those
  // gradients are not allocated here but by the first backward (Whole, ensure_grads) or the
  // first reduction (Sharded, accumulate_reduced) of a step, and zero_grads frees them.
  FlatUnit(Unit* unit, int index, Kind kind, Group* shard_group, const Ops& ops,
           float* bucket_grads, const MixedPrecisionPolicy& mp = {}, Tier opt_tier = Tier::Device,
           Tier param_tier = Tier::Device, bool release_grads = false);
  FlatUnit(const FlatUnit&) = delete;
  FlatUnit& operator=(const FlatUnit&) = delete;
  ~FlatUnit();

  Unit* unit() const { return unit_; }
  int index() const { return index_; }
  Kind kind() const { return kind_; }
  const FlatLayout& layout() const { return layout_; }
  int64_t shard_size() const { return layout_.shard_size(); }
  Range shard_range() const;  // this rank's slice of the flat buffer
  // Whether the full parameters stay allocated for the unit's whole life.
  bool persistent() const { return kind_ != Kind::Sharded; }
  DType param_dtype() const { return pdt_; }
  DType reduce_dtype() const { return rdt_; }
  // Kinds B/C with param_dtype != F32: the master has its own buffer and the full buffer is
  // the rounded compute copy.
  bool split_master() const { return split_; }
  // The 16-bit copy of the full parameters (above): each parameter's view into it (ParamSpec
  // order), valid when Unsharded; null when the unit keeps none (or holds no gathered copy).
  // The (padded) 16-bit copy itself, flat offsets; null where the unit keeps none.
  uint16_t* full16() const { return settle(), full16_; }
  const std::vector<const uint16_t*>* params16() const {
    return settle(), full16_ ? &params16_ : nullptr;
  }
  // Floats of the fp32 full buffer: the compact layout's where the unit keeps the 16-bit copy,
  // the padded layout's otherwise.
  int64_t f32_floats() const;
  // A persistent unit's initialiser writes every value (padded, flat offsets) here: the fp32
  // full buffer, or, where that is compact, a padded buffer finish_init consumes.
  float* init_target();
  // After the initialiser wrote init_target(): with a split master, copies this rank's slice
  // into the master and writes the compute copy (write_compute). Else a no-op.
  void finish_init();
  // A split master's compute copy of [off, off + n) (flat offsets) from the fp32 values `src`
  // (on the Ops' device; may be the fp32 buffer itself when it is padded): rounded to
  // param_dtype in the fp32 buffer where it holds them, narrowed into the 16-bit copy.
  void write_compute(int64_t off, int64_t n, const float* src);

  ShardedState sharded_state() const { return sstate_; }
  TrainingState training_state() const { return tstate_; }
  bool gather_in_flight() const { return gather_in_flight_; }
  const Work& gather_work() const { return gather_; }  // the last gather issued (its times)
  // Transient gathered parameters allocated (valid or in flight): what max_live_units counts.
  bool holds_gathered() const { return kind_ == Kind::Sharded && full_ != nullptr; }

  // ---- Parameters (FSDP2's unshard = issue + wait, reshard) ----------------------------
  // Sharded and no gather in flight: allocates the full buffer (if transient) and issues the
  // all-gather of every rank's master shard into it. Otherwise a no-op.
  void issue_unshard();
  // -> Unsharded: issues the gather if nobody did, waits for it.
  void wait_unshard();
  // Unsharded -> Sharded: frees the transient full buffer. A no-op for persistent parameters
  // and when already Sharded. Must not be called with a gather in flight.
  void reshard();
  // Stage 1 after the optimizer updated this rank's slice of the persistent full buffer: the
  // other slices are stale until the in-place all-gather issued here completes (-> Sharded,
  // gather in flight). Kind C with a split master: re-rounds the compute copy from the master
  // (no communication). Otherwise a no-op.
  void issue_regather();

  // ---- Compressed collectives (sharding/comm/quantize.h; policy.h CommQuantization) --------
  // Set by ShardedModel after construction. weights (Kind::Sharded): the gather quantises the
  // master shard (exact) into a packed slot (transient, Communication), all-gathers the packed
  // bytes and dequantises every slot into the full buffer (rounded to param_dtype after).
  // Blocks restart at each parameter's first value (quant_block_starts), and 1-D parameters
  // (biases, norm gains: a small part of the bytes) travel exact, as DeepSpeed never
  // quantises its persistent small parameters.
  // grad_peers (not null): issue_reduce_scatter is the quantised all-to-all over them, with
  // error feedback kept in a residual of the unsharded size (persistent, Grads), and returns a
  // completed Work (it ran on the calling thread).
  // worker (optional): runs the quantised reduce-scatter off the calling thread.
  void set_quantized(const QuantSpec& q, bool weights, PeerComm* grad_peers,
                     QuantWorker* worker = nullptr);
  // The quantised gradient reduction's residual (padded floats), null before its first use.
  const float* quant_residual() const { return qerr_.empty() ? nullptr : qerr_.f32(); }
  // The same, writable; create: made (zeroed) if it does not exist (a checkpoint load's target).
  float* quant_residual(bool create);
  bool quantized_grads() const { return qpeers_ != nullptr; }

  // ---- Training state -------------------------------------------------------------------
  void to_forward();        // Idle|Forward -> Forward (idempotent)
  void to_pre_backward();   // Forward|PreBackward -> PreBackward (needs Unsharded)
  void to_post_backward();  // PreBackward -> PostBackward
  void to_idle() { tstate_ = TrainingState::Idle; }

  // ---- Gradients ---------------------------------------------------------------------------
  // Makes the unsharded gradient buffer exist (transient ones, and a released Whole unit's,
  // are allocated zeroed).
  void ensure_grads();
  // release_grads: the gradients are freed between zero_grads and the next backward; every
  // view below makes them again (zero) where it is read, but grads() (per-parameter pointers:
  // null while released) and grad_full() of a sharded unit (its transient buffer).
  bool releases_grads() const { return release_; }
  // Released now (nothing allocated, all zero in value): the gradients' readers that only sum
  // them (grad_norm) skip the unit instead of making them again.
  bool grads_released() const {
    return release_ && !pending_ && (kind_ == Kind::Whole ? !grads_.allocated() : !grad_shard_);
  }
  // Zeroed unsharded gradients are not filled at once: their parameters' ranges stay
  // unwritten (zero in value; the alignment gaps and padding are zeros in memory), each until
  // the first op that produces it writes it (UnitCtx::grad_out: a GEMM with beta = 0 instead of
  // a fill and a read of the zeros; UnitCtx::grad zeroes it first to add into it), and all
  // that are left until anything else reads them (every view and operation below zeroes them
  // first). open_grads: ctx.grads for a call that may produce gradients (a training forward,
  // a backward), with the per-parameter flags of what is still unwritten
  // (UnitCtx::grads_fresh), which persist from call to call. (Not for a Whole unit's
  // gradients in a NO_SHARD bucket, which the bucket's all-reduce reads directly: zeroed at
  // once.)
  void open_grads(UnitCtx& ctx);
  bool has_grads() const { return grads_.allocated(); }
  // Backward wrote into the unsharded gradients since they were last reduced.
  bool grads_dirty() const { return dirty_; }
  void mark_dirty() { dirty_ = true; }
  // Sharded kinds: issues the reduce-scatter (average over the shard group) of the unsharded
  // gradients, in place into this rank's block of them. In a 16-bit reduce_dtype the
  // gradients are divided by S * `replicas` first and then summed (here, and by the caller's
  // all-reduce over the replicas): partial sums then never exceed what the average could
  // reach, so fp16 overflows as it would with one rank (a sum of S values, divided at the
  // end, could overflow where the average does not).
  Work issue_reduce_scatter(int replicas = 1);
  // The block that reduce-scatter wrote (what a HYBRID all-reduce averages over replicas):
  // shard_size() values of reduce_dtype().
  void* reduced_block() const;
  // Sharded kinds, once the reduction completed: reduced shard += block; then the unsharded
  // buffer is freed (transient) or zeroed (persistent). Clears dirty.
  void accumulate_reduced();
  // accumulate_reduced in two parts, for a caller that adds the block elsewhere (the host
  // updater, for gradient shards on the host): shard += block (n values of rdt) with `o`;
  // then, once the block has been read, free (transient) or zero (persistent) the unsharded
  // gradients, clear dirty and mark the shard non-zero.
  static void add_block(const Ops& o, float* shard, const void* block, DType rdt, size_t n);
  void release_reduced();
  // Kind::Whole: the reduction happened in place; clears dirty.
  void reduced_in_place() { dirty_ = false; }
  // Kind::Whole without replicas: rounds the gradients to reduce_dtype (where a multi-rank
  // run would narrow them for its reduction); a no-op for F32. Where the Ops round gradients
  // as they read them (Ops::rounds_grads_on_read: CUDA; the CPU to bf16), the rounding is left
  // pending: the step's norm and update read the gradients rounded (grad_shard_rounding)
  // without a pass of their own, and any other reader (every view below, the next call that
  // produces gradients) rounds them in place first.
  void round_grads();
  // The reduced gradients (unwritten ones zeroed) and, in *round, the type they are still to
  // be rounded to as they are read (F32: none): for the readers that round as they go
  // (Ops::sum_squares_rounded_into, adamw_copies' grad_dt).
  const float* grad_shard_rounding(DType* round) const;
  // Zeroes the reduced gradients and drops (or zeroes) the unsharded ones; with release_grads
  // frees what it released (after an update in flight, as for zeroing).
  void zero_grads();

  // ---- An update running elsewhere ---------------------------------------------------------
  // offload_optimizer cpu on a device: the unit's AdamW runs on a host thread (offload/
  // host_updater.h) while the device goes on. Until `done` completes, the update owns the
  // master, the gradient shard and the moments (a Whole unit's master is its full buffer).
  // settle() waits for it, rethrows its failure, then does what was left for after it:
  // `regather` (issue_regather: a Whole unit's compute copy) and a zero_grads() asked for
  // meanwhile (which does not wait). Every view below and every transition above and below
  // settles first, so nothing outside the update sees a half-updated unit.
  void set_pending_update(std::shared_ptr<Event> done, bool regather);
  bool update_pending() const { return pending_ != nullptr; }
  void settle() const {
    if (pending_) const_cast<FlatUnit*>(this)->finish_update();
  }

  // ---- Views -------------------------------------------------------------------------------
  // (shard) fp32 master; on the host (offload_param cpu on a device) after any upload of it
  // in flight has completed, so the caller may write it.
  // (Hands out a writable master: an fp8 gather's scales are taken again after it.)
  float* master() const { return settle(), wait_upload(), f8_fresh_ = false, master_; }
  // The last upload from the host (null when done and waited for, or none): what an NVMe
  // staging slot it read must not be refilled before.
  std::shared_ptr<Event> upload_event() const { return up_; }
  // (padded, or compact: f32_floats()) valid when Unsharded
  float* full() const { return settle(), full_; }
  // (shard) reduced gradients (a Whole unit's are its unsharded ones; the other kinds' are a
  // buffer of their own, which unwritten unsharded gradients do not concern)
  float* grad_shard() const {
    settle();
    remake_grads();
    if (kind_ == Kind::Whole) grads_.write_unwritten();
    return grad_shard_;
  }
  // (padded) unsharded gradients
  float* grad_full() const {
    return settle(), remake_grads(), grads_.write_unwritten(), grads_.data();
  }
  // AdamW moments (shard). Tier::Nvme units have none in memory except while the executor has
  // staged them (stage_moments), for their update or a checkpoint read.
  float* adam_m() const { return settle(), m_ptr_; }
  float* adam_v() const { return settle(), v_ptr_; }
  bool moments_on_nvme() const { return nvme_; }
  // Where the master shard and the gradient shard live: the Ops' device, or the CPU when they
  // are offloaded (param tier Host) while the unit computes on a device (offload_param cpu on a
  // GPU; a Whole unit's gradients stay on the device, they are its full gradient buffer).
  // ops_on(d): the Ops for buffers on d (the CPU's fp32 Ops, or the unit's).
  Device master_device() const { return hm_ ? Device::cpu() : ops_->device(); }
  Device grad_device() const {
    return hm_ && kind_ != Kind::Whole ? Device::cpu() : ops_->device();
  }
  const Ops& ops_on(Device d) const;
  // The AdamW moments in host memory while the unit's state is on a device (offload_optimizer
  // cpu on a GPU): its update runs on the CPU (OffloadedState::update_on_host).
  bool moments_on_host() const {
    return !nvme_ && !m_.empty() && m_.device().is_cpu() && !ops_->device().is_cpu();
  }
  void stage_moments(float* m, float* v) { settle(), m_ptr_ = m, v_ptr_ = v; }
  // param_tier Tier::Nvme (Kind::Sharded only): the master and reduced gradient shards live
  // in the NVMe file; master() / grad_shard() are null except while the executor has staged
  // them (a gather's source, a reduction's accumulator, an optimizer piece, a checkpoint or
  // export access). grads_zero(): the reduced gradients are all zero (nothing accumulated
  // since zero_grads), so the file's copy need not be read.
  bool params_on_nvme() const { return pnvme_; }
  void stage_master(float* p) { settle(), f8_fresh_ = false, master_ = p; }
  void stage_grad(float* g) { settle(), grad_shard_ = g; }
  bool grads_zero() const { return grads_zero_; }
  const std::vector<float*>& params() const { return settle(), params_; }  // per spec, into full
  // Per spec, into grad_full.
  const std::vector<float*>& grads() const {
    return settle(), grads_.write_unwritten(), grads_.ptrs();
  }
  // Gathers this unit's master shards into `out` (padded floats) without touching the state:
  // a collective, for parameter export between steps.
  void gather_params_into(float* out) const;
  // Same for the reduced gradient shards.
  void gather_grads_into(float* out) const;

  // Schedule positions of the unit's first and last calls (set by ShardedModel).
  int first_pos = -1, last_pos = -1;

  // Waits for any collective and any update of this unit still in flight (errors swallowed):
  // for teardown.
  void quiesce() noexcept;

 private:
  void point_params();
  void issue_narrow_gather();  // the param_dtype all-gather into full16_ or the front of full_
  void make_full16(Mem cat);   // allocates the (padded) 16-bit copy
  void finish_gather();        // waits for the gather; widens it when it ran in param_dtype
  void widen_runs();           // the 16-bit copy's fp32 runs into the (compact) fp32 buffer
  // The fp8 all-gather (above): its tables, its issue and its unpacking.
  void build_fp8_gather();
  void issue_fp8_gather();
  void finish_fp8_gather();

  Unit* unit_;
  int index_;
  Kind kind_;
  Group* shard_;  // the shard group (size S)
  const Ops* ops_;
  FlatLayout layout_;
  int rank_;  // in the shard group

  DType pdt_ = DType::F32, rdt_ = DType::F32;
  bool split_ = false;
  bool w16_ = false;       // keeps the 16-bit copy (full16_)
  Buffer master_buf_;      // Kind::Sharded, or a split master: (shard) Params
  Buffer full_buf_;        // (f32_floats()): transient Communication, or persistent Params
  Buffer full16_buf_;      // (padded, param_dtype) the 16-bit copy: as full_buf_
  Buffer init_buf_;        // init_target() of a compact unit, until finish_init
  Buffer m_, v_;           // (shard) Optimizer; empty on Tier::Nvme
  float* m_ptr_ = nullptr;
  float* v_ptr_ = nullptr;
  bool nvme_ = false;
  bool pnvme_ = false;
  bool hm_ = false;    // master and gradient shards on the host, the unit on a device
  Buffer stage_;       // hm_: host staging of a narrowed shard / a reduced block (kept)
  // hm_: at least `bytes` of stage_ (a narrowed shard or a reduced block on its way).
  void* host_stage(size_t bytes);
  // A shard (master or gradients, on `where`) gathered into `out` on the Ops' device.
  void gather_shard_into(const float* shard, Device where, float* out) const;
  bool grads_zero_ = true;
  bool release_ = false;  // release_grads (the constructor's)
  // release_: a released gradient buffer (Whole: the unsharded one; Sharded: the reduced
  // shard) made again, zero, for a reader.
  void remake_grads() const;
  UnitGrads grads_;        // (padded) unsharded grads: what is unwritten, a rounding left
  Buffer grad_shard_buf_;  // (shard) reduced grads, Kinds Sharded/FullReplicated
  float* master_ = nullptr;
  float* full_ = nullptr;
  uint16_t* full16_ = nullptr;
  float* grad_shard_ = nullptr;
  std::vector<float*> params_;
  std::vector<const uint16_t*> params16_;

  ShardedState sstate_ = ShardedState::Sharded;
  TrainingState tstate_ = TrainingState::Idle;
  Work gather_;
  bool gather_in_flight_ = false;
  bool dirty_ = false;
  // offload_param cpu or nvme on a device: the last upload of the host shard (or of its
  // narrowed copy in stage_, or of an NVMe staging slot) into the gather's slot, on the copy
  // stream; the compute stream waits for it natively, the host only before it writes the
  // master or the stage again (the io queue before it refills an NVMe slot: upload_event).
  mutable std::shared_ptr<Event> up_;
  QuantSpec qspec_;
  // Each rank's shard's block table (blocks restart at every parameter) and its spec.
  std::vector<std::vector<int64_t>> qtables_;
  std::vector<std::vector<uint8_t>> qraw_;  // per rank: its blocks sent exact (1-D parameters)
  std::vector<QuantSpec> qranks_;
  bool qw_ = false;              // quantised gathers
  PeerComm* qpeers_ = nullptr;   // quantised reduce-scatters over these
  QuantWorker* qworker_ = nullptr;
  Buffer qwire_;                 // the packed shards of a quantised gather in flight
  Buffer qerr_;                  // (padded) error feedback of the quantised reduce-scatter
  // fp8 all-gather: per rank, its slice as segments in flat order: E4M3 bytes (tensor: an index
  // into f8_tensors_, or -1 for an alignment gap: scale 1) at slot byte `pos`, or bf16 values
  // (tensor -2) at `pos`, their fp32 copy at `f32` in the compact buffer.
  struct Fp8Seg {
    int64_t lo = 0, hi = 0, pos = 0, f32 = -1;
    int tensor = -1;
  };
  bool f8_ = false;                          // this unit gathers fp8 (every gather it issues)
  int64_t f8_slot_ = 0;                      // bytes of one rank's slot
  std::vector<std::vector<Fp8Seg>> f8_segs_;  // per rank
  std::vector<std::pair<int64_t, int64_t>> f8_tensors_;  // [lo, hi) of each 16-bit-only tensor
  std::vector<float> f8_scale_;              // the last gather's scale per tensor
  // f8_scale_ holds the scales of the master as it is: set by a gather, cleared by anything
  // that hands out the master for writing (master(), stage_master): FULL_SHARD's backward
  // gather reuses its forward's, without the amaxes' all-reduce (8% of a step of 2 ranks on
  // one host). Whether a gather runs that all-reduce must be the same on every rank of the
  // shard group, so those calls must be too: today every caller is a collective or a step
  // every rank takes (an update, a checkpoint read or write, an import, DiLoCo's outer step,
  // an NVMe staging); SHARDWISE_COMM_DEBUG=1 reports a rank that breaks this.
  mutable bool f8_fresh_ = false;
  void wait_upload() const;
  void upload(void* dst, const void* src, size_t bytes);
  // An update running elsewhere (set_pending_update) and what waits for it.
  void finish_update();
  std::shared_ptr<Event> pending_;
  bool regather_after_ = false, zero_after_ = false;
};

}  // namespace sw
