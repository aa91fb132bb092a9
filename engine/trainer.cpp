// The training loop over the ranks of world_group() (one process without mpirun; N ranks
// under `mpirun -np N shardwise train`), each holding a ShardedModel shard as the config's
// sharding policy says.
//
// The mesh (config.h ParallelismConfig): with tensor degree t, the W ranks form D = W / t
// data-parallel slots of t consecutive ranks (the tensor group, which splits the model:
// build_model's TensorSlice{r % t, t}); the policy shards over the data group (the ranks with
// the same r % t). Below, W and r are the data-parallel size and rank (D and r / t): the t
// ranks of a tensor group read the same rows and hold the same loss, which is averaged over the
// data group; run_dir, metrics and the progress line stay world rank 0's.
//
// Per optimizer step s (0-based), on every rank r of W:
//   zero grads; for k in 0..accum-1: rows (k*W + r)*B .. +B of step s (engine/data.h)
//   -> micro_step(batch, 1/accum, last = k == accum-1)
//   (each rank's gradient is that of its mean loss; ShardedModel averages over ranks, so the
//   result is the gradient of the mean loss over the global batch: N ranks train exactly
//   what one rank with micro-batch N*B would); then the gradient norm, whose read brings the
//   micro-steps' losses with it (on a GPU the step's one host synchronisation);
//   loss = sum over ranks / (W * accum); clip factor min(1, clip / (norm + 1e-6)) with the
//   global norm; lr = lr_at(a), AdamW step a + 1 with a = optimizer steps applied so far (= s
//   unless fp16 skipped overflowing steps, see below); validation on eval steps over
//   eval_batches * W batches of B rows, split over the ranks (the windows one rank with
//   micro-batch W*B would evaluate).
// With loss masks (engine/data.h) micro-step k counting c_k of the global batch's C targets
// gets W c_k / C instead of 1/accum, and the loss is sum over ranks of c_k * mean_k / C: the
// mean over the counted targets of the global batch (validation likewise).
// Rank 0 alone writes run_dir (config.json, metrics.jsonl) and prints; the end-of-run export
// (run_dir/hf/, a Hugging Face directory) has each rank write the weights files it owns.
//
// Mixed precision: the sharding policy's mixed_precision (from bf16/fp16) makes ShardedModel
// gather and compute in bf16/fp16 and reduce gradients in reduce_dtype; masters and AdamW stay
// fp32. fp16 adds loss scaling (engine/loss_scaler.h): micro_step gets grad_scale =
// scale / accum; the global gradient norm (reduced identically on every rank) decides
// overflow: non-finite -> the step is skipped (gradients dropped, weights and AdamW state
// untouched) and the scaler lowers the scale; otherwise the gradients are unscaled through
// AdamW's grad_mult (1/scale times the clip factor, which is computed on the unscaled norm).
// As in DeepSpeed (engine._take_model_step), a skipped step consumes its batch but does not
// advance the LR schedule nor AdamW's step count: both count applied steps only.
// Without fp16, a non-finite gradient norm stays an error.
//
// Checkpoints (engine/checkpointer.h): with checkpoint.every_steps = E > 0, a save follows
// every step s+1 that is a multiple of E, and the last step when checkpoint.save_final. The
// saved TrainState holds the step count; the batches (engine/data.h), the LR and AdamW's bias
// correction are functions of the step, and the model state is the checkpoint's, so a run
// resumed at step N computes exactly what the uninterrupted run computed from step N on.
// Async saves are committed at the first step start where every rank's writer is done (one
// tiny all-reduce per step while a save is pending), and before the next save or the end.
// A failed periodic save prints one warning line per failing rank, is recorded in
// metrics.jsonl (ckpt_failed) and training goes on (the previous checkpoint and `latest` are
// unchanged); a failed final save is an error (exit 1) since the run ends without the state
// the user asked for.
//
// Errors with several ranks: an error every rank reaches together (a non-finite loss or
// gradient norm, decided on reduced values) is printed once by rank 0, then every rank ends;
// an error on some ranks only is printed with its rank and the job is aborted (comm_abort),
// so no rank is left waiting in a collective.
#include "engine/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/export.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/sharded_checkpoint.h"
#include "core/alloc.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/launch.h"
#include "engine/checkpointer.h"
#include "engine/clock.h"
#include "engine/data.h"
#include "engine/loss_scaler.h"
#include "engine/metrics.h"
#include "engine/plan_setup.h"
#include "engine/profiler.h"
#include "engine/schedule.h"
#include "sharding/pipeline_schedule.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "planner/hardware.h"
#include "planner/pipeline.h"
#include "planner/search.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "sharding/wrap.h"

namespace sw {

namespace fs = std::filesystem;

namespace {

// Creates `dir` if needed and proves it is writable, before any work is done. `what` names it
// in messages ("run_dir", "profile.out").
void prepare_dir(const std::string& what, const std::string& dir) {
  const std::string comp = what == "run_dir" ? "train" : "profile";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(comp, what + " '" + dir + "': cannot create it (" + ec.message() + ")");
  if (!fs::is_directory(dir, ec))
    fail(comp, what + " '" + dir + "': exists and is not a directory");
  const std::string probe = (fs::path(dir) / ".shardwise-write-test").string();
  FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) fail(comp, what + " '" + dir + "': not writable (" + std::strerror(errno) + ")");
  std::fclose(f);
  std::remove(probe.c_str());
}

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) fail("train", path + ": cannot write (" + std::strerror(errno) + ")");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    fail("train", path + ": write failed (" + std::strerror(errno) + ")");
}

// An error that every rank raises at the same point (decided on values reduced over ranks).
struct CollectiveError : Error {
  using Error::Error;
};

[[noreturn]] void non_finite(const char* what, double v, int step, const std::string& detail) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  throw CollectiveError("train: non-finite " + std::string(what) + " (" + buf + ") at step " +
                        std::to_string(step) + detail +
                        "; stopping (lower optimizer.params.lr or set gradient_clipping; files "
                        "already written in run_dir are kept, the weights of this run are not "
                        "exported)");
}

// What the trainer records of the profiled steps (see ProfileHook in trainer.h): its coarse
// actions, the executor's action records (every action of the step plan, on its queue), and
// every allocation and free from the device tracker's event log (core/alloc.h), which is on
// while recording; each event carries the plan action that was running when it happened.
class ProfileRecorder {
 public:
  ProfileRecorder(int rank, int world) {
    data_.rank = rank, data_.world = world;
    for (int m = 0; m < static_cast<int>(Mem::Count); ++m)
      data_.categories.push_back(mem_name(static_cast<Mem>(m)));
  }
  ~ProfileRecorder() { stop(); }
  ProfileRecorder(const ProfileRecorder&) = delete;
  ProfileRecorder& operator=(const ProfileRecorder&) = delete;

  // The first call fixes mem_start and switches the event log on.
  void begin_step() {
    if (started_) return;
    started_ = true;
    MemTracker& mt = MemTracker::global();
    for (size_t i = 0; i < data_.categories.size(); ++i)
      data_.mem_start[data_.categories[i]] = static_cast<int64_t>(mt.current(static_cast<Mem>(i)));
    mt.take_log();
    mt.enable_log(true, size_t{1} << 20);
    logging_ = true;
  }
  // Records one action that ran from t0 to now; returns its index in data().actions.
  size_t action(int step, int micro, int index, const char* kind, Clock::time_point t0) {
    drain();
    TraceAction a;
    a.step = step, a.micro = micro, a.action = index, a.queue = "compute", a.kind = kind;
    a.t_begin = secs(t0);
    a.t_end = secs(Clock::now());
    data_.actions.push_back(a);
    return data_.actions.size() - 1;
  }
  // The executor's records appended to `er` since the last call (the actions of the step
  // plan, sharding/step_plan.h) become trace actions of micro-step `micro` on their queues.
  // `seg_begin`: where that segment starts in the whole step's plan (-1: unknown). micro < 0:
  // each action's own (a pipeline segment runs every micro-batch; its chunk goes in args).
  void take_exec(const ShardedModel& sm, sw::StepRecorder& er, int step, int micro,
                 int seg_begin = -1) {
    drain();
    for (const ActionRecord& r : er.records) {
      TraceAction a;
      a.step = step, a.micro = micro >= 0 ? micro : r.micro, a.action = r.action;
      if (micro < 0 && r.chunk >= 0) a.args.push_back({"chunk", double(r.chunk)});
      if (seg_begin >= 0 && r.action >= 0) a.plan_index = seg_begin + r.action;
      a.queue = queue_name(r.queue);
      a.kind = action_kind_name(r.kind);
      a.unit = r.unit, a.call = r.call, a.bytes = r.bytes;
      if (r.unit >= 0) a.unit_name = sm.unit_name(r.unit);
      if (r.bucket >= 0) a.unit_name = "bucket " + std::to_string(r.bucket);
      a.t_begin = r.t_begin, a.t_end = std::max(r.t_begin, r.t_end);
      if (r.stream) a.stream = r.stream, a.host_begin = r.host_begin, a.host_end = r.host_end;
      data_.actions.push_back(std::move(a));
    }
    er.records.clear();
  }
  bool started() const { return started_; }
  // Switches the log off; data() is complete after this.
  void stop() {
    if (!logging_) return;
    drain();
    MemTracker::global().enable_log(false);
    logging_ = false;
  }
  ProfileData& data() { return data_; }
  static double secs(Clock::time_point t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
  }

 private:
  void drain() {
    if (!logging_) return;
    MemTracker& mt = MemTracker::global();
    if (mt.log_dropped() > 0)
      std::fprintf(stderr, "shardwise: warning: profile: %zu memory events dropped\n",
                   mt.log_dropped());
    for (const MemEvent& e : mt.take_log())
      data_.mem.push_back(MemSample{e.t_s, e.action, mem_name(e.cat), e.delta});
  }
  ProfileData data_;
  bool started_ = false, logging_ = false;
};

// One training run on this rank. The phases, in the order run() calls them:
//   set-up      communication and threads, profile.out (checked on every rank), run dir,
//               data, model + sharding, start point (resume / init_from), checkpointer,
//               metrics
//   step(s)     micro-steps, loss reduction, norm / overflow / clipping, optimizer
//   evaluate(s) validation loss on eval steps and the last step
//   checkpoints periodic save after a step (after_step), final save (finish_checkpoints)
//   export      the final weights (export_weights)
// A per-rank memory budget for the device tier while it lives (0 = none).
struct BudgetScope {
  void set(size_t bytes) { MemTracker::global().set_budget(bytes); }
  ~BudgetScope() { MemTracker::global().set_budget(0); }
};

class Run {
 public:
  Run(const TrainConfig& cfg, const TrainOptions& opts, Group& world, GroupPtr world_ptr)
      : cfg_(cfg), opts_(opts), world_(world), world_ptr_(std::move(world_ptr)),
        W_(world.size()), rank_(world.rank()), t_(cfg.parallelism.tensor),
        p_(cfg.parallelism.pipeline), D_(W_ / t_ / p_), prank_(rank_ / (W_ / p_)),
        srank_(rank_ % (W_ / p_)), drank_(srank_ / t_), lead_(rank_ == 0), ck_(cfg.checkpoint), run_dir_(cfg.run_dir),
        B_(cfg.micro_batch), T_(cfg.model.seq_len), accum_(cfg.grad_accum),
        tokens_per_step_(static_cast<double>(B_) * T_ * accum_ * D_) {}

  // The set-up phases (TrainSession's constructor), then run(): the steps from next_.
  void setup() {
    setup_comm_and_threads();
    setup_profiler();
    setup_run_dir();
    setup_data();
    setup_model();
    setup_start();
    write_run_config();  // only now: a run refused above leaves an existing run dir as it was
    setup_checkpointer();
    setup_metrics();
    summary_.unigram_entropy = train_data_->unigram_entropy();
    next_ = start_;
  }

  TrainSummary run() {
    t_start_ = Clock::now();
    const int first = next_;
    summary_.stopped = false;
    for (int s = next_; s < cfg_.train_steps; ++s) {
      const bool last = s + 1 == cfg_.train_steps;
      StepMetrics m = step(s);
      finish_step(s, m, last);
      after_step(s, last);
      next_ = s + 1;
      if (opts_.on_step && stop_requested(m) && !last) {
        summary_.stopped = true;
        break;
      }
    }
    progress_->finish();
    finish_checkpoints(first, next_);
    summary_.tokens_per_s = timed_s_ > 0 ? timed_tokens_ / timed_s_ : 0;
    export_weights();
    return summary_;
  }

  // TrainSession's calls between runs.
  int next_step() const { return next_; }
  double evaluate_now() { return val_data_ ? evaluate(next_) : -1.0; }
  std::string save_now() {
    std::unique_ptr<Checkpointer> own;
    Checkpointer* c = ckpt_.get();
    if (!c) c = (own = std::make_unique<Checkpointer>(ck_.dir, ck_.keep_last, false, world_)).get();
    CkptEvents ev = c->save(*sm_, train_state(next_));
    ev.add(c->finish());
    if (ev.failed >= 0)
      throw CollectiveError("checkpoint: " + Checkpointer::step_name(next_) + " was not saved" +
                            (ev.error.empty() ? "" : ": " + ev.error) +
                            "; the previous checkpoints and 'latest' are unchanged");
    ++summary_.checkpoints_saved, summary_.last_checkpoint = next_;
    return (fs::path(ck_.dir) / Checkpointer::step_name(next_)).string();
  }
  std::string export_to(const std::string& dir) {
    if (model_.config.type == "gpt2" || model_.config.type == "llama") {
      export_hf(dir);
      return dir;
    }
    // A user's model has no Hugging Face architecture: its tensors as they are named, one
    // file that rank 0 writes from a consolidated copy. (Split models: the logical tensors
    // are assembled from the built-in models' splits, and stages are not gathered here.)
    if (p_ > 1 || t_ > 1)
      throw CollectiveError(std::string("export: a model of your own split over ") +
                            (p_ > 1 ? "pipeline stages" : "tensor ranks") +
                            " is not exported yet");
    const std::string path = (fs::path(dir) / "model.safetensors").string();
    sm_->gather_full_params(/*rank0_only=*/true);  // collective
    std::string err;
    if (lead_) try {
        prepare_dir("run_dir", dir);
        export_hf_safetensors(*sm_, path);
      } catch (const std::exception& e) {
        err = e.what();
      }
    sm_->release_full_params();
    if (sum_over_ranks(world_, err.empty() ? 0.0 : 1.0) > 0)
      throw CollectiveError(err.empty() ? "export: " + path + ": failed on rank 0" : err);
    return path;
  }

 private:
  // ---- Set-up ------------------------------------------------------------------------------

  void setup_comm_and_threads() {
    if (cfg_.comm_timeout_s > 0) world_.set_timeout(cfg_.comm_timeout_s);
    if (cfg_.comm_debug) world_.set_debug(true);
    // The mesh's groups (collective; they inherit the world's options): the tensor group is
    // the t consecutive ranks of this data-parallel slot, the data group the ranks with the
    // same tensor rank, ranked by data rank.
    // Pipeline parallelism (outermost): the W / p ranks of stage s are [s W/p, (s+1) W/p),
    // the mesh above inside them; the pipe group the ranks of every stage holding the same
    // data and tensor slot, ranked by stage.
    GroupPtr stage = world_ptr_;
    if (p_ > 1) {
      stage = world_.split(prank_, rank_);
      pipe_group_ = world_.split(srank_, prank_);
    }
    data_group_ = stage;
    if (t_ > 1) {
      tensor_group_ = stage->split(srank_ / t_, srank_);
      data_group_ = stage->split(srank_ % t_, srank_);
    }
    set_num_threads(cfg_.threads);
  }

  // The run dir is checked (created, writable) first, so a bad one fails fast, but written
  // (config.json) only once the data, model and start point are accepted.
  void setup_run_dir() {
    if (lead_) prepare_dir("run_dir", cfg_.run_dir);
  }
  void write_run_config() {
    if (lead_) write_text((run_dir_ / "config.json").string(), cfg_.resolved_json);
  }

  void setup_data() {
    const int V = cfg_.model.vocab_size;
    train_data_ = std::make_unique<Corpus>(cfg_.train_data, V, T_);
    if (!cfg_.val_data.empty()) val_data_ = std::make_unique<Corpus>(cfg_.val_data, V, T_);
  }

  void setup_model() {
    // memory_budget: checked from the first parameter allocation on, lifted when the run ends.
    budget_.set(cfg_.memory_budget);
    // peak_mem_bytes (and the host tier's, the reservations') are this run's peaks
    for (size_t t = 0; t < static_cast<size_t>(Tier::Count); ++t)
      MemTracker::of(static_cast<Tier>(t)).reset_peaks();
    model_ = make_model();
    // Fewer KV heads than tensor ranks: K and V are replicated (models/tensor_units.cpp).
    if (t_ > 1 && lead_ && model_.config.type == "llama" && model_.config.n_kv_head % t_ != 0)
      std::fprintf(stderr,
                   "shardwise: note: model.n_kv_head %d < parallelism.tensor_parallel_degree "
                   "%d: every tensor rank holds all K and V projections (replicated, their "
                   "gradients summed) and uses its query heads' KV head\n",
                   model_.config.n_kv_head, t_);
    wrap_blocks(model_, cfg_.blocks_per_unit);
    if (p_ > 1) {  // this rank's stage
      const std::vector<int> bounds = pipeline_bounds(cfg_, model_);
      stage_bounds_ = bounds;
      model_ = stage_model(std::move(model_), bounds, p_, cfg_.parallelism.stages_per_rank(), prank_);
      if (lead_) {
        std::string b;
        for (size_t i = 0; i < bounds.size(); ++i) b += (i ? " " : "") + std::to_string(bounds[i]);
        std::fprintf(stderr,
                     "shardwise: pipeline: %d ranks x %d stages, %s, stage bounds (schedule "
                     "positions) %s\n",
                     p_, cfg_.parallelism.stages_per_rank(), cfg_.parallelism.schedule.c_str(),
                     b.c_str());
      }
    }
    ShardingPolicy policy = cfg_.sharding;
    // HYBRID_SHARD's default group: a node's data-parallel ranks (its ranks / t, at least 1).
    const int local = launch_env().local_size;
    if (policy.strategy == ShardingStrategy::HybridShard && policy.shard_group_size == 0)
      policy.shard_group_size = default_shard_group(D_, local > 0 ? std::max(1, local / t_) : 0);
    // Local SGD / DiLoCo: each replica (HYBRID_SHARD's shard group, or one NO_SHARD rank) is a
    // model of its own, FULL_SHARD inside; the outer step averages over the replica groups.
    GroupPtr model_group = data_group_;
    if (cfg_.local_sgd.on()) {
      const int S = policy.strategy == ShardingStrategy::HybridShard ? policy.shard_group_size : 1;
      if (D_ / S < 2)
        throw CollectiveError("local_sgd.sync_every: one replica group (" + std::to_string(D_) +
                              " data-parallel rank(s) in shard groups of " + std::to_string(S) +
                              "): nothing to average; use more ranks or a smaller "
                              "shard_group_size");
      model_group = S == 1 ? make_local_group() : data_group_->split(drank_ / S, drank_);
      replica_group_ = data_group_->split(drank_ % S, drank_);
      if (policy.strategy == ShardingStrategy::HybridShard) {
        policy.strategy = ShardingStrategy::FullShard;
        policy.shard_group_size = 0;
      }
    }
    sm_ = std::make_unique<ShardedModel>(
        model_, ops_for(device_from_name(cfg_.device)), cfg_.seed, model_group, policy,
        tensor_group_,
        PipeSetup{pipe_group_, static_cast<int>(pipe_schedule_from_name(cfg_.parallelism.schedule))},
        replica_group_);
    sm_->prepare_offload(B_, T_);  // offload files sized for this batch shape, before training
    scaler_ = LossScaler(cfg_.loss_scaler);
  }

  // This rank's model (its tensor slice): the user's (TrainOptions::model_factory) or the
  // config's.
  Model make_model() const {
    const TensorSlice slice{srank_ % t_, t_};
    if (opts_.model_factory) return opts_.model_factory(slice);
    return t_ > 1 ? build_model(cfg_.model, slice) : build_model(cfg_.model);
  }

  // Where the run starts: a checkpoint (resume), exported weights (init_from), or the init.
  void setup_start() {
    resume_dir_ = resolve_resume(ck_.resume, ck_.dir);
    if (!resume_dir_.empty()) {
      const TrainState st = load_checkpoint(*sm_, resume_dir_);
      if (st.seed != cfg_.seed)
        fail("resume", resume_dir_ + ": saved by a run with seed " + std::to_string(st.seed) +
                           ", this config has seed " + std::to_string(cfg_.seed) +
                           " (the data order depends on it; set seed to match)");
      if (st.step > cfg_.train_steps)
        fail("resume", resume_dir_ + ": is at step " + std::to_string(st.step) +
                           ", beyond train_steps (" + std::to_string(cfg_.train_steps) + ")");
      if (cfg_.fp16 && st.loss_scale > 0) {  // the loss scaler continues where it was
        scaler_.scale = st.loss_scale;
        scaler_.good_steps = st.scaler_good_steps;
        scaler_.hysteresis_left = st.scaler_hysteresis_left;
      }
      start_ = static_cast<int>(st.step);
      applied_ = static_cast<int>(st.optimizer_steps);
      summary_.resumed_from = resume_dir_;
      if (lead_)
        std::fprintf(stderr, "shardwise: resumed from %s at step %d\n", resume_dir_.c_str(),
                     start_);
    } else if (ck_.resume == "auto" && lead_) {
      std::fprintf(stderr, "shardwise: no checkpoint in %s yet; starting at step 0\n",
                   ck_.dir.c_str());
    }
    if (!ck_.init_from.empty()) {
      import_safetensors(*sm_, ck_.init_from);
      if (lead_) std::fprintf(stderr, "shardwise: initialised from %s\n", ck_.init_from.c_str());
    }
    summary_.start_step = start_;
    // The first round starts here, unless the checkpoint resumed held one.
    if (cfg_.local_sgd.on() && !sm_->round_restored()) sm_->start_round();
  }

  void setup_checkpointer() {
    if (ck_.every_steps > 0) {
      // State on NVMe: saves stream it from the files (bounded staging); an async snapshot
      // would be a second full copy of it in host memory, which the offload exists to avoid.
      const bool async = ck_.async && !sm_->state_on_nvme();
      if (ck_.async && !async && lead_)
        std::fprintf(stderr,
                     "shardwise: checkpoint.async: the optimizer or parameter state lives on "
                     "NVMe; saves are synchronous, streamed from its files\n");
      ckpt_ = std::make_unique<Checkpointer>(ck_.dir, ck_.keep_last, async, world_);
      // Async saves: the snapshot memory is allocated now and faulted in on a background
      // thread, so the first save stalls for the copy only, as later ones do.
      ckpt_->reserve(*sm_);
    }
  }

  void setup_metrics() {
    if (lead_)
      metrics_ = std::make_unique<MetricsLog>((run_dir_ / "metrics.jsonl").string(),
                                              resume_dir_.empty() ? -1 : start_);
    progress_ = std::make_unique<Progress>(cfg_.train_steps, cfg_.log_every_steps,
                                           opts_.progress && lead_, stderr, -1, start_);
    inputs_.resize(static_cast<size_t>(B_) * T_);
    targets_.resize(static_cast<size_t>(B_) * T_);
    counted_.resize(static_cast<size_t>(accum_));
    batch_ = Batch{inputs_.data(), targets_.data(), B_, T_};
    if (p_ > 1) {  // every micro-batch of a step at once
      pipe_in_.assign(size_t(accum_), std::vector<int32_t>(size_t(B_) * T_));
      pipe_tg_.assign(size_t(accum_), std::vector<int32_t>(size_t(B_) * T_));
      for (int k = 0; k < accum_; ++k)
        pipe_batches_.push_back({pipe_in_[size_t(k)].data(), pipe_tg_[size_t(k)].data(), B_, T_});
    }
    adam_.lr = cfg_.optimizer.lr;
    adam_.beta1 = cfg_.optimizer.beta1;
    adam_.beta2 = cfg_.optimizer.beta2;
    adam_.eps = cfg_.optimizer.eps;
    adam_.weight_decay = cfg_.optimizer.weight_decay;
    adam_.type = optimizer_type_from_name(cfg_.optimizer.type);  // (Adam: AdamW)
    adam_.momentum = cfg_.optimizer.momentum, adam_.dampening = cfg_.optimizer.dampening;
    adam_.nesterov = cfg_.optimizer.nesterov;
    adam_.trust_coefficient = cfg_.optimizer.trust_coefficient;
    adam_.max_coeff = cfg_.optimizer.max_coeff, adam_.min_coeff = cfg_.optimizer.min_coeff;
    adam_.bias_correction = cfg_.optimizer.bias_correction;
  }

  // profile.out must be writable on every rank before any step; one collective decides, so
  // the error is printed once.
  void setup_profiler() {
    if (!cfg_.profile.enabled) return;
    summary_.profile.dir = cfg_.profile.out;
    std::string err;
    try {
      prepare_dir("profile.out", cfg_.profile.out);
    } catch (const Error& e) {
      err = e.what();
    }
    const double failed = sum_over_ranks(world_, err.empty() ? 0.0 : 1.0);
    if (failed > 0) {
      if (!err.empty() && !lead_) std::fprintf(stderr, "shardwise: error: rank %d: %s\n", rank_,
                                               err.c_str());
      throw CollectiveError(!err.empty() ? err
                                         : "profile: profile.out '" + cfg_.profile.out +
                                               "': not writable on " +
                                               std::to_string(static_cast<int>(failed)) +
                                               " rank(s) (see their messages)");
    }
    recorder_ = std::make_unique<ProfileRecorder>(rank_, W_);
  }

  // ---- One optimizer step ------------------------------------------------------------------

  bool profiled(int step1) const {
    return recorder_ && step1 >= cfg_.profile.start_step &&
           step1 < cfg_.profile.start_step + cfg_.profile.num_steps;
  }

  // Checkpoint work reported on the next metrics line (and summed into the summary).
  void note_ckpt(const CkptEvents& ev) {
    ckpt_activity_ = true;
    ckpt_since_line_.add(ev);
    summary_.ckpt_stall_s += ev.stall_s;
    if (ev.committed >= 0) ++summary_.checkpoints_saved, summary_.last_checkpoint = ev.committed;
    if (ev.failed >= 0) {
      ++summary_.checkpoints_failed;
      if (!ev.error.empty()) {
        std::string who = W_ > 1 ? "rank " + std::to_string(rank_) + ": " : "";
        std::fprintf(stderr,
                     "shardwise: warning: %scheckpoint %s not saved: %s; the previous "
                     "checkpoints and 'latest' are unchanged\n",
                     who.c_str(), Checkpointer::step_name(ev.failed).c_str(), ev.error.c_str());
      }
    }
  }

  void write_metrics(const StepMetrics& m) {
    if (metrics_) metrics_->write(m);
  }

  // Step s (0-based): the micro-steps, the loss over ranks, the gradient norm (overflow,
  // clipping) and the optimizer update. Returns the step's metrics so far (no validation).
  StepMetrics step(int s) {
    if (ckpt_ && ckpt_->pending()) note_ckpt(ckpt_->poll());
    const bool rec = profiled(s + 1);
    if (rec) {
      if (!recorder_->started())  // every rank is here: one origin for all ranks' traces
        recorder_->data().t_origin =
            sum_over_ranks(world_, lead_ ? ProfileRecorder::secs(Clock::now()) : 0.0);
      recorder_->begin_step();
      if (step_plan_.actions.empty()) {
        // (zero bubble: the copies its deferred backwards keep, measured on a stage of its own)
        std::vector<int64_t> deferred;
        if (p_ > 1 && pipe_schedule_splits_backward(
                          pipe_schedule_from_name(cfg_.parallelism.schedule))) {
          Model m = make_model();
          wrap_blocks(m, cfg_.blocks_per_unit);
          Model st = stage_model(std::move(m), stage_bounds_, p_,
                                 cfg_.parallelism.stages_per_rank(), prank_);
          deferred = measure_deferred(st, B_, T_, cfg_.sharding.mixed_precision.param_dtype);
        }
        step_plan_ = sm_->step_plan(B_, T_, accum_, deferred);
      }
      sm_->set_recorder(&exec_rec_);  // the executor records every action of the step plan
      if (hook() && hook()->begin_step) hook()->begin_step(s + 1);
    }
    const auto t0 = Clock::now();
    const CpuUsage u0 = cpu_usage();
    const CommStats c0 = sm_->comm_stats();
    sm_->zero_grads();
    const double loss_scale = cfg_.fp16 ? scaler_.scale : 1.0;
    // With loss masks, the step's loss is the mean over the counted targets of the whole global
    // batch (as Megatron and torchtitan do): micro-step k of this rank, counting c_k of the
    // step's total C, gets grad_scale = W c_k / C (ShardedModel divides by c_k, then averages
    // over the W data-parallel ranks). Every rank computes C from the masks (the data order is
    // a pure function), with no communication. Without masks c_k = B T and the old,
    // bitwise-equal 1 / accum is used.
    const int64_t GB = int64_t{accum_} * D_ * B_;
    const bool masked = train_data_->has_mask();
    double counted_total = 0;
    if (masked)
      counted_total = static_cast<double>(train_counted(*train_data_, cfg_.seed, s, GB, 0, GB));
    std::vector<float> scales;  // pipeline: every micro-batch's, for one pipeline_step
    const auto tp0 = Clock::now();
    for (int k = 0; k < accum_; ++k) {
      const auto tk = Clock::now();
      const bool piped = p_ > 1;
      int32_t* in = piped ? pipe_in_[size_t(k)].data() : inputs_.data();
      int32_t* tg = piped ? pipe_tg_[size_t(k)].data() : targets_.data();
      counted_[static_cast<size_t>(k)] = train_batch(
          *train_data_, cfg_.seed, s, GB, (int64_t{k} * D_ + drank_) * B_, B_, T_, in, tg);
      const double micro_scale =
          !masked ? loss_scale / static_cast<double>(accum_)
          : counted_total > 0
              ? loss_scale * D_ * static_cast<double>(counted_[static_cast<size_t>(k)]) /
                    counted_total
              : 0.0;
      if (piped) {  // all of them in one pipeline segment, below
        scales.push_back(static_cast<float>(micro_scale));
        continue;
      }
      // The loss stays on the device: read with the gradient norm, the step's one
      // synchronisation with a GPU.
      sm_->micro_step(batch_, static_cast<float>(micro_scale), k + 1 == accum_);
      if (rec) {
        sm_->settle_recorder();  // on a GPU: the device's times (waits for the micro-step)
        recorder_->take_exec(*sm_, exec_rec_, s + 1, k, segment_begin(k));
        recorder_->action(s + 1, k, k, "forward_backward", tk);
      }
    }
    if (p_ > 1) {
      sm_->pipeline_step(pipe_batches_, scales);
      if (rec) {
        sm_->settle_recorder();
        recorder_->take_exec(*sm_, exec_rec_, s + 1, -1, segment_begin(0));
        recorder_->action(s + 1, 0, 0, "pipeline", tp0);
      }
    }
    const auto tn = Clock::now();
    const double norm = sm_->grad_norm() / loss_scale;  // of the unscaled gradients
    if (rec) recorder_->action(s + 1, 0, accum_, "grad_norm", tn);
    double loss = 0;
    int bad_micro = -1;  // first micro-step with a non-finite loss on this rank
    const std::vector<double> losses = sm_->step_losses();
    const double norm_read_s = seconds_since(tn);
    for (size_t k = 0; k < losses.size(); ++k) {
      if (!std::isfinite(losses[k]) && bad_micro < 0) bad_micro = static_cast<int>(k);
      loss += masked ? losses[k] * static_cast<double>(counted_[k]) : losses[k];
    }
    // (over the data group: the ranks of a tensor group hold the same loss)
    if (masked)
      loss = counted_total > 0 ? sum_over_ranks(*data_group_, loss) / counted_total : 0.0;
    else
      loss = sum_over_ranks(*data_group_, loss) / (static_cast<double>(accum_) * D_);
    const float lr = lr_at(cfg_.optimizer, cfg_.scheduler, cfg_.train_steps, applied_);
    if (!std::isfinite(loss)) {
      StepMetrics m;
      m.step = s + 1, m.loss = loss, m.lr = lr;
      m.grad_norm = NAN, m.peak_mem_bytes = MemTracker::global().total_peak();
      write_metrics(m);
      progress_->finish();
      std::string detail;
      if (bad_micro >= 0 && accum_ > 1)
        detail += " (micro-step " + std::to_string(bad_micro) + ")";
      non_finite("loss", loss, s + 1, detail);
    }
    const bool overflow = cfg_.fp16 && !std::isfinite(norm);
    if (cfg_.fp16) {
      try {
        scaler_.update(overflow);
      } catch (const Error& e) {  // decided on the reduced norm: every rank is here
        throw CollectiveError(std::string(e.what()) + " (step " + std::to_string(s + 1) + ")");
      }
    }
    if (!overflow && !std::isfinite(norm)) {
      StepMetrics m;
      m.step = s + 1, m.loss = loss, m.lr = lr, m.grad_norm = norm;
      m.peak_mem_bytes = MemTracker::global().total_peak();
      write_metrics(m);
      progress_->finish();
      non_finite("gradient norm", norm, s + 1, "");
    }
    const auto to = Clock::now();
    if (overflow) {
      sm_->zero_grads();  // the step is skipped: weights and AdamW state stay as they are
    } else {
      const double clip =
          cfg_.grad_clip > 0 ? std::min(1.0, cfg_.grad_clip / (norm + 1e-6)) : 1.0;
      sm_->optimizer_step(adam_, lr, static_cast<float>(clip / loss_scale), applied_ + 1);
      ++applied_;
      if (cfg_.local_sgd.on()) local_sgd_sync(s + 1 == cfg_.train_steps);
    }
    if (rec) {
      sm_->settle_recorder();
      recorder_->take_exec(*sm_, exec_rec_, s + 1, accum_ - 1, segment_begin(p_ > 1 ? 1 : accum_));
      sm_->set_recorder(nullptr);
      recorder_->action(s + 1, 0, accum_ + 1, overflow ? "skip_step" : "optimizer", to);
    }
    const double dt = seconds_since(t0);
    const CpuUsage u1 = cpu_usage();
    const CommStats c1 = sm_->comm_stats();

    StepMetrics m;
    m.step = s + 1;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = norm;
    m.step_time_s = dt;
    m.norm_read_s = norm_read_s;
    m.tokens_per_s = dt > 0 ? tokens_per_step_ / dt : 0;
    m.comm_s = c1.comm_s - c0.comm_s;
    m.exposed_comm_s = c1.exposed_s - c0.exposed_s;
    m.overflow = overflow;
    m.skipped_steps = s + 1 - applied_;
    m.epoch = train_data_->epoch_of(s * GB);
    set_cpu_usage(m, u0, u1);
    if (cfg_.fp16) m.loss_scale = loss_scale;
    if (rec) {
      step_t0_ = t0;
      step_comm_bytes_ = static_cast<int64_t>(c1.bytes - c0.bytes);
    }
    return m;
  }

  // Validation on eval_batches * W batches of B rows (the same windows one rank with
  // micro-batch W*B evaluates in eval_batches batches); data rank r takes batches r, r+W, ...
  double evaluate(int step) {
    const int n = cfg_.eval_batches * D_;
    double sum = 0;
    int first_bad = -1;
    // With masks: the mean over the counted targets of all n batches (as training's loss).
    const bool masked = val_data_->has_mask();
    std::vector<int64_t> counted;
    for (int i = drank_; i < n; i += D_) {
      counted.push_back(eval_batch(*val_data_, i, n, B_, T_, inputs_.data(), targets_.data()));
      sm_->eval_step(batch_);  // on a device: no read until eval_losses
    }
    const std::vector<double> losses = sm_->eval_losses();
    double my_count = 0;
    for (size_t k = 0; k < losses.size(); ++k) {  // batch drank_ + k D_
      if (!std::isfinite(losses[k]) && first_bad < 0) first_bad = drank_ + int(k) * D_;
      sum += masked ? losses[k] * static_cast<double>(counted[k]) : losses[k];
      my_count += static_cast<double>(counted[k]);
    }
    const double total = sum_over_ranks(*data_group_, sum);
    if (!std::isfinite(total))
      non_finite("validation loss", total, step,
                 first_bad >= 0 ? " (eval batch " + std::to_string(first_bad) + ")" : "");
    if (masked) {
      const double all = sum_over_ranks(*data_group_, my_count);
      return all > 0 ? total / all : 0.0;
    }
    return total / n;
  }

  // After step s: validation when due, the metrics line, the progress line, the summary, and
  // the profile of a recorded step.
  void finish_step(int s, StepMetrics& m, bool last) {
    const bool rec = profiled(s + 1);
    if (val_data_ &&
        (last || (cfg_.eval_every_steps > 0 && (s + 1) % cfg_.eval_every_steps == 0))) {
      const auto te = Clock::now();
      m.val_loss = evaluate(s + 1);
      m.has_val = true;
      summary_.last_val_loss = m.val_loss;
      if (rec) recorder_->action(s + 1, 0, accum_ + 2, "evaluate", te);
    }
    m.peak_mem_bytes = MemTracker::global().total_peak();
    m.host_peak_mem_bytes = static_cast<int64_t>(MemTracker::of(Tier::Host).total_peak());
    m.reserved_peak_bytes = 0;
    for (size_t t = 0; t < static_cast<size_t>(Tier::Count); ++t)
      m.reserved_peak_bytes += static_cast<int64_t>(MemTracker::of(static_cast<Tier>(t)).reserved_peak());
    if (ckpt_activity_) {
      m.ckpt_stall_s = ckpt_since_line_.stall_s;
      m.ckpt_saved = ckpt_since_line_.committed;
      m.ckpt_failed = ckpt_since_line_.failed;
      ckpt_since_line_ = CkptEvents{};
      ckpt_activity_ = false;
    }
    write_metrics(m);
    progress_->update(m, seconds_since(t_start_));

    const double dt = m.step_time_s;
    if (s > start_) timed_s_ += dt, timed_tokens_ += tokens_per_step_;
    if (cfg_.train_steps - start_ == 1) timed_s_ = dt, timed_tokens_ = tokens_per_step_;
    summary_.steps = s + 1;
    summary_.last_loss = m.loss;
    summary_.skipped_steps = m.skipped_steps;
    summary_.loss_scale = cfg_.fp16 ? scaler_.scale : 0;

    if (rec) {
      record_step(m);
      const int last_rec = std::min(cfg_.train_steps,
                                    cfg_.profile.start_step + cfg_.profile.num_steps - 1);
      if (s + 1 == last_rec) write_profile();
    }
  }

  // The enclosing "step" action of a recorded step (its children are already recorded).
  void record_step(const StepMetrics& m) {
    const size_t i = recorder_->action(m.step, 0, -1, "step", step_t0_);
    TraceAction& a = recorder_->data().actions[i];
    a.bytes = step_comm_bytes_;
    a.args = {{"loss", m.loss},           {"grad_norm", m.grad_norm},
              {"lr", m.lr},               {"tokens_per_s", m.tokens_per_s},
              {"comm_s", m.comm_s},       {"exposed_comm_s", m.exposed_comm_s},
              {"step_time_s", m.step_time_s}};
    if (m.has_val) a.args.push_back({"val_loss", m.val_loss});
    ++summary_.profile.steps_recorded;
    if (hook() && hook()->end_step) hook()->end_step(m.step);
  }

  // Where segment `seg` (micro-step k = seg, the optimizer = accum) starts in step_plan_.
  int segment_begin(int seg) const {
    return static_cast<size_t>(seg) < step_plan_.segments.size()
               ? step_plan_.segments[static_cast<size_t>(seg)].begin
               : -1;
  }

  // The plan's memory over the recorded steps: each recorded plan action's planned
  // allocations and frees at the time it ended (applied from the measured start, as the
  // measured samples are): the dashed line over the measured chart.
  std::vector<MemSample> planned_samples(const ProfileData& d) const {
    std::vector<MemSample> out;
    for (const TraceAction& a : d.actions) {
      if (a.plan_index < 0 || static_cast<size_t>(a.plan_index) >= step_plan_.actions.size())
        continue;
      const Action& pa = step_plan_.actions[static_cast<size_t>(a.plan_index)];
      for (size_t c = 0; c < pa.mem.size(); ++c)
        if (pa.mem[c]) out.push_back({a.t_end, a.action, mem_name(static_cast<Mem>(c)), pa.mem[c]});
    }
    return out;
  }

  // plan_rank<r>.json: what `shardwise plan` predicts for this rank's step (the plan replayed
  // with allocations before frees, the kernel-workspace estimate beside it), for `shardwise
  // profile --plan` to print beside the measured peaks.
  void write_plan_prediction(const std::string& path) const {
    // (tensor parallelism: the kernels see one rank's heads, d_ff and vocabulary; the
    // groups' scratch counts with any group of more than one rank)
    const DevicePeak dp = device_peak(step_plan_, tensor_local_config(cfg_.model, t_), B_, T_,
                                      cfg_.sharding.mixed_precision, W_,
                                      num_threads(), cfg_.device != "cpu");
    const PlanPeak& pk = dp.plan;
    const int64_t ws = dp.workspace;
    nlohmann::json j;
    j["rank"] = rank_;
    j["peak_bytes"] = pk.total;
    j["workspace_estimate_bytes"] = ws;
    {  // the process's resident set, as `plan` predicts it (the default profile's baseline)
      std::optional<HardwareProfile> hw;
      try {
        std::error_code ec;
        if (fs::exists(default_hardware_path(), ec)) hw = load_hardware(default_hardware_path());
      } catch (const Error&) {
      }
      const int64_t host = host_bytes(step_plan_);
      PlanInput pin = make_plan_input(model_, sm_->policy(), D_);
      pin.on_device = cfg_.device != "cpu";
      PlanSetup ps = plan_setup(cfg_, W_);  // (the config as `plan` sees it; the data mapped)
      ps.data_bytes = int64_t(train_data_ ? train_data_->map_bytes() : 0) +
                      int64_t(val_data_ ? val_data_->map_bytes() : 0);
      const RssPrediction rss = predict_rss(step_plan_, pin, pk.total + ws, host, ps,
                                            hw ? &*hw : nullptr);
      j["rss_bytes"] = rss.total;
      j["rss_baseline_bytes"] = rss.baseline;
    }
    j["peak_action"] = pk.action;
    j["peak_kind"] = pk.action >= 0
                         ? action_kind_name(step_plan_.actions[static_cast<size_t>(pk.action)].kind)
                         : "";
    nlohmann::json at = nlohmann::json::object();
    for (size_t c = 0; c < pk.at_peak.size(); ++c) at[mem_name(static_cast<Mem>(c))] = pk.at_peak[c];
    j["at_peak"] = at;
    write_profile_file(path, j.dump(1) + "\n");
  }

  // Each rank writes its files into profile.out.
  void write_profile() {
    recorder_->stop();
    ProfileData& d = recorder_->data();
    std::vector<MemSample> predicted;
    if (hook() && hook()->finish) hook()->finish(d, predicted);
    if (predicted.empty() && !step_plan_.actions.empty()) predicted = planned_samples(d);
    ProfileResult& r = summary_.profile;
    const fs::path dir(cfg_.profile.out);
    const std::string tag = "_rank" + std::to_string(rank_);
    r.trace_path = (dir / ("trace" + tag + ".json")).string();
    r.svg_path = (dir / ("memory" + tag + ".svg")).string();
    r.peaks_path = (dir / ("peaks" + tag + ".json")).string();
    r.peaks = compute_peaks(d);
    {
      const CpuUsage u = cpu_usage();
      r.peaks.max_rss_bytes = std::max(u.max_rss_bytes, u.rss_bytes);
    }
    r.tracker_peak_bytes = static_cast<int64_t>(MemTracker::global().total_peak());
    write_chrome_trace(d, r.trace_path);
    write_memory_svg(d, r.svg_path, predicted.empty() ? nullptr : &predicted);
    write_peaks_json(r.peaks, r.peaks_path);
    if (!step_plan_.actions.empty()) {
      r.plan_path = (dir / ("plan" + tag + ".json")).string();
      write_plan_prediction(r.plan_path);
    }
  }

  const ProfileHook* hook() const { return opts_.profile_hook; }

  // ---- Checkpoints -------------------------------------------------------------------------

  TrainState train_state(int step) const {
    TrainState st;
    st.step = step;
    st.seed = cfg_.seed;
    st.optimizer_steps = applied_;
    if (cfg_.fp16) {
      st.loss_scale = scaler_.scale;
      st.scaler_good_steps = scaler_.good_steps;
      st.scaler_hysteresis_left = scaler_.hysteresis_left;
    }
    st.config_json = cfg_.resolved_json;
    return st;
  }

  // on_step (TrainOptions): whether any rank asked to stop; a throw on any rank is an error
  // every rank raises here, after the same all-reduce.
  bool stop_requested(const StepMetrics& m) {
    double flag = 0;
    std::string err;
    try {
      flag = opts_.on_step(m) ? 1 : 0;
    } catch (const std::exception& e) {
      err = e.what();
      if (err.empty()) err = "exception without a message";
    } catch (...) {
      err = "unknown exception";
    }
    for (char& ch : err)
      if (ch == '\n' || ch == '\r') ch = ' ';
    if (!err.empty()) flag = 1e6;  // (W < 1e6: the sum tells a throw from stop requests)
    const double all = W_ > 1 ? sum_over_ranks(world_, flag) : flag;
    if (all >= 1e6) {
      progress_->finish();
      const std::string at = "on_step callback failed at step " + std::to_string(m.step);
      const std::string kept = "; checkpoints committed before are kept";
      if (!err.empty() && !lead_)  // rank 0 prints the collective error
        std::fprintf(stderr, "shardwise: error: rank %d: train: %s: %s\n", rank_, at.c_str(),
                     err.c_str());
      throw CollectiveError("train: " + at + ": " +
                            (err.empty() ? "on " + std::to_string(int(all / 1e6)) +
                                               " rank(s) (see their messages)"
                                         : err) +
                            kept);
    }
    return all > 0;
  }

  // Periodic save (the final one is finish_checkpoints').
  void after_step(int s, bool last) {
    if (ckpt_ && !last && (s + 1) % ck_.every_steps == 0)
      note_ckpt(ckpt_->save(*sm_, train_state(s + 1)));
  }

  // After steps [first, end) ran; end < train_steps: stopped (on_step), saved unless
  // after_step just did.
  void finish_checkpoints(int first, int end) {
    if (!ckpt_) return;
    note_ckpt(ckpt_->finish());  // a pending async save
    const bool periodic_last = end % ck_.every_steps == 0;
    const bool stopped = end < cfg_.train_steps;
    const bool ran = first < end;
    if (stopped && periodic_last) return;
    if (!(ran && (ck_.save_final || periodic_last || stopped))) return;
    CkptEvents ev = ckpt_->save(*sm_, train_state(end));
    ev.add(ckpt_->finish());
    const bool failed = ev.failed >= 0;
    const std::string err = ev.error;
    ev.error.clear();  // reported below, as an error rather than a warning
    note_ckpt(ev);
    if (failed) {
      if (rank_ != 0 && !err.empty())  // rank 0 prints the collective error
        std::fprintf(stderr, "shardwise: error: rank %d: final checkpoint not saved: %s\n", rank_,
                     err.c_str());
      throw CollectiveError("train: the final checkpoint " +
                            Checkpointer::step_name(end) + " was not saved" +
                            (err.empty() ? " (see the ranks' messages)" : ": " + err) +
                            "; the previous checkpoints and 'latest' are unchanged");
    }
  }

  // ---- Export ------------------------------------------------------------------------------

  // Local SGD / DiLoCo, after each applied step: every sync_every / fragments applied steps the
  // next fragment's outer step (all units when fragments is 1). With fragment_sync_delay d the
  // reduce is issued then and its update lands d applied steps later (a resumed run finds the
  // reduce in flight restored from the checkpoint). The run's last step lands what is in
  // flight and syncs every fragment, so all replicas end equal.
  void local_sgd_sync(bool last) {
    const LocalSgdConfig& l = cfg_.local_sgd;
    const int every = l.sync_every / l.fragments, d = l.sync_delay;
    auto frag = [&](int s0) { return (s0 / every - 1) % l.fragments; };
    auto issued = [&](int s0) { return s0 > 0 && s0 % every == 0; };
    if (d > 0 && issued(applied_ - d)) outer_step(frag(applied_ - d), OuterPhase::Update);
    if (last) {
      for (int k = 1; k < d; ++k)
        if (issued(applied_ - k)) outer_step(frag(applied_ - k), OuterPhase::Update);
      for (int f = 0; f < l.fragments; ++f) outer_step(f, OuterPhase::Both);
    } else if (issued(applied_)) {
      outer_step(frag(applied_), d > 0 ? OuterPhase::Reduce : OuterPhase::Both);
    }
  }

  void outer_step(int fragment, OuterPhase phase) {
    const LocalSgdConfig& l = cfg_.local_sgd;
    OuterArgs o{l.outer_lr, l.outer_momentum, l.outer_nesterov,
                l.outer_dtype == "bf16" ? DType::BF16 : DType::F32, 0, l.update_alpha};
    if (l.outer_dtype == "int8" || l.outer_dtype == "int4") o.bits = l.outer_dtype == "int8" ? 8 : 4;
    sm_->outer_step(o, fragment, l.fragments, phase);
    if (phase != OuterPhase::Reduce) ++summary_.outer_steps;
  }

  void export_weights() {
    if (!opts_.export_weights) return;
    summary_.weights_path = export_to((run_dir_ / "hf").string());
  }

  // A Hugging Face directory (run_dir/config.json is the run's own), streamed: every rank
  // gathers one unit at a time and writes the weights files it owns (hf_export.h).
  void export_hf(const fs::path& hf) {
    HfExportOptions o;
    o.max_shard_bytes = ck_.export_shard_bytes;
    o.tokenizer = cfg_.tokenizer;
    // (Pipeline stages: collective over the world, each stage writing its tensors. Local SGD:
    // the run ended with an outer step, every replica holds the same weights: the first writes.)
    if (replica_group_) {
      const GroupPtr writers = world_.split(replica_group_->rank() == 0 ? 0 : -1, rank_);
      if (writers) export_hf_dir(*sm_, hf.string(), o, nullptr, writers.get());
      world_.barrier();  // (the directory is complete on every rank's return)
    } else {
      export_hf_dir(*sm_, hf.string(), o, nullptr, &world_);  // collective
    }
  }

  // ---- State -------------------------------------------------------------------------------

  BudgetScope budget_;  // first member: lifted after everything else is destroyed
  const TrainConfig& cfg_;
  const TrainOptions& opts_;
  Group& world_;
  GroupPtr world_ptr_;
  const int W_, rank_;       // the world
  // The mesh: tensor degree, pipeline degree, data-parallel size, pipeline rank, rank within
  // the stage, data rank.
  const int t_, p_, D_, prank_, srank_, drank_;
  const bool lead_;  // writes run_dir, prints
  GroupPtr data_group_;    // the policy's group: the world, or the ranks of this tensor rank
  GroupPtr tensor_group_;  // the ranks of this data-parallel slot (null when t = 1)
  GroupPtr pipe_group_;    // the ranks of this slot in every stage (null when p = 1)
  GroupPtr replica_group_;  // local SGD: this shard's ranks in every replica (null: none)
  std::vector<std::vector<int32_t>> pipe_in_, pipe_tg_;  // pipeline: the step's micro-batches
  std::vector<Batch> pipe_batches_;
  std::vector<int> stage_bounds_;  // pipeline: the stages' schedule positions
  const CheckpointConfig& ck_;
  const fs::path run_dir_;
  const int B_, T_, accum_;
  const double tokens_per_step_;

  std::unique_ptr<Corpus> train_data_, val_data_;
  Model model_;
  std::unique_ptr<ShardedModel> sm_;
  LossScaler scaler_;  // used with fp16 only
  int start_ = 0;    // steps done before this run (resume)
  int next_ = 0;     // the next step to run (0-based)
  int applied_ = 0;  // optimizer steps applied; the others (s + 1 - applied) were skipped
  std::string resume_dir_;

  std::unique_ptr<Checkpointer> ckpt_;
  CkptEvents ckpt_since_line_;  // checkpoint work not yet reported in metrics.jsonl
  bool ckpt_activity_ = false;

  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<Progress> progress_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<int64_t> counted_;  // (accum_) targets the loss counts per micro-step this step
  Batch batch_{};
  AdamWParams adam_;

  std::unique_ptr<ProfileRecorder> recorder_;  // profile block enabled
  sw::StepRecorder exec_rec_;                  // the executor's records of a profiled step
  StepPlan step_plan_;  // the whole step's plan (profiled runs): the recorded actions' indices
  Clock::time_point step_t0_{};
  int64_t step_comm_bytes_ = 0;

  TrainSummary summary_;
  Clock::time_point t_start_{};
  double timed_s_ = 0, timed_tokens_ = 0;  // steps after the first
};

// "auto" keys (TrainConfig::autoplan): the planner's search (planner/search.h) from the input
// `shardwise plan` plans from too (engine/plan_setup.h) varies only what is "auto", within
// memory_budget, on the calibrated hardware profile when there is one (default_hardware_path),
// else round nominal figures; every rank computes the same choice.
void resolve_auto_plan(TrainConfig& cfg, int world, bool lead) {
  const AutoSearch search = auto_search(cfg, world);
  const PlanSetup& base = search.base;
  const SearchOptions& so = search.options;
  HardwareProfile hw = nominal_hardware(world);
  const std::string path = default_hardware_path();
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    hw = load_hardware(path);
    if (world > 1 && !hw.has_collectives) {  // calibrated at one rank
      const HardwareProfile nom = nominal_hardware(world);
      hw.has_collectives = true;
      hw.all_gather = nom.all_gather, hw.reduce_scatter = nom.reduce_scatter;
      hw.all_reduce = nom.all_reduce;
    }
  }
  if (cfg.autoplan.pipeline) {  // the pipeline's dimensions (planner/pipeline.h)
    const TrainConfig::AutoPlan& a = cfg.autoplan;
    if (a.blocks || a.checkpointing || a.offload_optimizer || a.offload_param || a.tensor)
      throw CollectiveError(
          "auto: parallelism.pipeline_parallel_degree \"auto\" with other \"auto\" keys is not "
          "supported yet; give the others");
    const PipelineSearch ps =
        search_pipeline(plan_setup(cfg, world), static_cast<int64_t>(cfg.memory_budget), hw);
    if (ps.best < 0)
      throw CollectiveError("auto: no pipeline degree, schedule and micro-batch fits "
                            "memory_budget " + format_bytes(cfg.memory_budget) + " per rank (" +
                            std::to_string(ps.evaluated.size()) + " tried)");
    const PipelineEvaluated& e = ps.evaluated[size_t(ps.best)];
    cfg.parallelism.pipeline = e.c.pipeline;
    cfg.parallelism.virtual_stages = e.c.chunks;
    cfg.parallelism.schedule = pipe_schedule_name(static_cast<PipeSchedule>(e.c.schedule));
    cfg.parallelism.split_points.clear();
    cfg.micro_batch = e.c.micro_batch;
    cfg.grad_accum = e.c.accum;
    cfg.autoplan = {};
    cfg.resolved_json = config_json(cfg);
    if (lead)
      std::fprintf(stderr,
                   "auto: memory_budget %s per rank: %s (predicted largest stage peak %s, step "
                   "%.3f s, bubble %.1f%% on hardware '%s'; %zu candidates)\n",
                   format_bytes(cfg.memory_budget).c_str(), e.c.describe().c_str(),
                   format_bytes(size_t(e.device)).c_str(), e.step_s, 100 * e.bubble,
                   hw.name.c_str(), ps.evaluated.size());
    return;
  }
  const SearchResult r = search_plans(base, so, hw);
  if (r.best < 0)
    throw CollectiveError(
        "auto: no plan fits memory_budget " + format_bytes(cfg.memory_budget) +
        " per rank; the smallest feasible budget is " +
        format_bytes(size_t(double(r.smallest.device) / (1.0 - so.margin))) + " (" +
        r.smallest.c.describe() + "), dominated by " + dominant_category(r.smallest));
  const Evaluated& best = r.frontier[size_t(r.best)];
  const PlanSetup s = apply_candidate(base, best.c, &so.free);
  const int group = cfg.sharding.shard_group_size;
  cfg.sharding = s.policy;
  cfg.sharding.shard_group_size = group;
  cfg.blocks_per_unit = s.blocks_per_unit;
  if (so.free.tensor) {  // (the global batch kept: a data-parallel rank's rows change with it)
    cfg.parallelism.tensor = s.tensor;
    cfg.micro_batch = s.micro_batch;
    cfg.grad_accum = s.accum;
  }
  cfg.autoplan = {};
  cfg.resolved_json = config_json(cfg);
  if (lead)
    std::fprintf(stderr,
                 "auto: memory_budget %s per rank: %s (predicted device peak %s, host %s, nvme %s; "
                 "step %.3f s on hardware '%s'; %d plans searched)\n",
                 format_bytes(cfg.memory_budget).c_str(), best.c.describe().c_str(),
                 format_bytes(size_t(best.device)).c_str(), format_bytes(size_t(best.host)).c_str(),
                 format_bytes(size_t(best.nvme)).c_str(), best.time.step_s, hw.name.c_str(),
                 r.evaluated);
}

}  // namespace

// Each gap of tensor parallelism refused in one line naming its key; lift a line once its
// part is done.
void refuse_tensor_parallel_gaps(const TrainConfig& cfg, const std::string& command) {
  if (const int p = cfg.parallelism.pipeline; p > 1 && command != "train")
    std::fprintf(stderr,
                 "shardwise: note: %s runs the whole model on one rank; "
                 "parallelism.pipeline_parallel_degree %d applies to training\n",
                 command.c_str(), p);
  const int t = cfg.parallelism.tensor;
  if (t <= 1) return;
  const std::string pre = cfg.source + ": ";
  const std::string tp = "with parallelism.tensor_parallel_degree " + std::to_string(t);
  auto refuse = [&](const std::string& key, const std::string& what, const std::string& fix) {
    fail("config", pre + key + ": " + what + " " + tp + " is not implemented yet; " + fix);
  };
  if (command != "train") {  // (the weights are whole tensors: the whole model on one rank)
    std::fprintf(stderr,
                 "shardwise: note: %s runs the whole model on one rank; "
                 "parallelism.tensor_parallel_degree %d applies to training\n",
                 command.c_str(), t);
    return;
  }
  // (Checkpoints save and resume across mesh shapes: checkpoint/sharded_checkpoint.h, v2.)
  // (The simulated device runs the device path: staged tensor groups, copies. CUDA's kernels of
  // the tensor-parallel ops compile but have not run on a GPU yet.)
  if (cfg.device != "cpu" && cfg.device != "sim")
    refuse("device", "'" + cfg.device + "' (not yet run on a GPU)", "use cpu");
  if (cfg.sharding.offload_param.device == OffloadDevice::Nvme)
    refuse("zero_optimization.offload_param.device", "nvme", "use none or cpu");
}

// train()'s errors: one rank, thrown to the caller; several, an error every rank reached
// (CollectiveError) printed once by rank 0, any other with its rank, and the job ended.
template <class F>
auto collective_errors(Group& world, F&& f) -> decltype(f()) {
  if (world.size() == 1) return f();
  try {
    return f();
  } catch (const CollectiveError& e) {
    if (world.rank() == 0) std::fprintf(stderr, "shardwise: error: %s\n", e.what());
    std::fflush(stderr);
    world.barrier();  // rank 0 has printed before anyone ends the job
    comm_abort(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardwise: error: rank %d: %s\n", world.rank(), e.what());
    std::fflush(stderr);
    comm_abort(1);
  }
}

struct TrainSession::Impl {
  TrainConfig cfg;
  TrainOptions opts;
  GroupPtr world;
  std::unique_ptr<Run> t;  // holds references to cfg and opts
};

TrainSession::TrainSession(const TrainConfig& cfg_in, const TrainOptions& opts)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.opts = opts;
  // A TrainConfig built in code gets the checks a file gets (one read from a file has had
  // them; they hold as long as no field was changed since).
  TrainConfig& cfg = I.cfg;
  cfg = cfg_in;
  validate_config(cfg);
  if (cfg.resolved_json.empty()) cfg.resolved_json = config_json(cfg);
  const std::string& source = cfg.source;
  if (cfg.train_data.empty())
    fail("config", source +
                       ": data.train: required for training (an llm.c-format token file, see "
                       "`shardwise data prepare`)");

  refuse_tensor_parallel_gaps(cfg, "train");

  I.world = world_group();
  const GroupPtr& world = I.world;
  // The mesh's one check that needs the world (every rank fails alike, before any collective).
  if (const int t = cfg.parallelism.tensor; world->size() % t != 0)
    fail("config", source + ": parallelism.tensor_parallel_degree: " + std::to_string(t) +
                       " does not divide the world size (" + std::to_string(world->size()) +
                       " rank" + (world->size() > 1 ? "s" : "") + ")");
  if (const int p = cfg.parallelism.pipeline, t = cfg.parallelism.tensor;
      world->size() % (p * t) != 0)
    fail("config", source + ": parallelism.pipeline_parallel_degree: " + std::to_string(p) +
                       (t > 1 ? " x tensor_parallel_degree " + std::to_string(t) : std::string()) +
                       " does not divide the world size (" + std::to_string(world->size()) +
                       " rank" + (world->size() > 1 ? "s" : "") + ")");
  // Tensor groups are consecutive ranks: inside a host only when t divides the ranks per host.
  if (const int t = cfg.parallelism.tensor, local = launch_env().local_size;
      t > 1 && local > 0 && local % t != 0 && world->rank() == 0)
    std::fprintf(stderr,
                 "shardwise: note: parallelism.tensor_parallel_degree %d does not divide the %d "
                 "ranks per host: some tensor groups span hosts\n",
                 t, local);
  collective_errors(*world, [&] {
    if (world->rank() == 0)
      for (const std::string& n : cfg_in.notes) std::fprintf(stderr, "%s\n", n.c_str());
    if (cfg.autoplan.any()) {
      if (I.opts.model_factory)
        fail("config", source + ": \"auto\" keys plan the config's gpt2 / llama; with a model "
                                "of your own, give them values");
      resolve_auto_plan(cfg, world->size(), world->rank() == 0);
    }
    refuse_tensor_parallel_gaps(cfg, "train");  // (what "auto" chose)
    I.t = std::make_unique<Run>(I.cfg, I.opts, *world, world);
    I.t->setup();
  });
}

TrainSession::~TrainSession() = default;

TrainSummary TrainSession::train() {
  return collective_errors(*impl_->world, [&] { return impl_->t->run(); });
}
double TrainSession::evaluate() {
  return collective_errors(*impl_->world, [&] { return impl_->t->evaluate_now(); });
}
std::string TrainSession::save_checkpoint() {
  return collective_errors(*impl_->world, [&] { return impl_->t->save_now(); });
}
std::string TrainSession::export_weights(const std::string& dir) {
  return collective_errors(*impl_->world, [&] { return impl_->t->export_to(dir); });
}
int TrainSession::step() const { return impl_->t->next_step(); }
const TrainConfig& TrainSession::config() const { return impl_->cfg; }

TrainSummary train(const TrainConfig& cfg, const TrainOptions& opts) {
  return TrainSession(cfg, opts).train();
}

}  // namespace sw
