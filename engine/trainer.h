// The training loop: data, micro-batches with gradient accumulation, clipping, AdamW with the
// LR schedule, periodic validation, metrics.jsonl, a live progress line, and the final
// weights exported to <run_dir>/hf/ as a Hugging Face model directory (checkpoint/hf_export.h).
//
// With the config's profile block enabled, the steps it names are recorded (ProfileHook below)
// and each rank writes its trace, memory chart and peaks into profile.out (engine/profiler.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/metrics.h"
#include "engine/profiler.h"
#include "models/model.h"

namespace sw {

// Where the trainer hands the profiled steps to whoever records more than it knows. Every
// callback is optional and runs on every rank.
//
// The trainer fills ProfileData with: per recorded step one "step" action on the compute
// queue (loss, grad_norm, lr, tokens_per_s in its args) enclosing its coarse actions (one
// "forward_backward" per micro-step, "grad_norm", "optimizer", "evaluate"); every action the
// step-plan executor ran (sharding/step_plan.h: gathers, waits, forward/backward/recompute
// calls, frees, reductions, optimizer updates) on its queue with unit, call and bytes; and
// every allocation and free from the device tracker's event log, tagged with the plan action
// that caused it. finish() may add to it and hand a predicted timeline for the chart.
struct ProfileHook {
  std::function<void(int step)> begin_step;  // before a recorded step's first micro-step
  std::function<void(int step)> end_step;    // after its optimizer update (and evaluation)
  // After the last recorded step, before the files are written: may add to or replace what
  // the trainer recorded, and fill `predicted` (drawn dashed on the memory chart).
  std::function<void(ProfileData& data, std::vector<MemSample>& predicted)> finish;
};

struct TrainOptions {
  bool progress = true;  // live progress line on stderr (step/total, loss, tokens/s, ETA)
  bool export_weights = true;
  ProfileHook* profile_hook = nullptr;  // not owned; used when the profile block is enabled
  // A user's model instead of the config's gpt2 / llama (the C++ facade, shardwise/trainer.h):
  // called on every rank with its tensor slice ({0, 1} without tensor parallelism) wherever
  // the trainer builds the model. The config's model block then gives vocab_size and seq_len.
  std::function<Model(TensorSlice)> model_factory;
  // After each step (its validation and periodic checkpoint included), on every rank: true
  // asks to stop; every rank stops after the step where any asked (one tiny all-reduce per
  // step while it is set), the run ending as at its last step (a checkpoint when the
  // checkpoint block is on, the export). A throw ends the run as an error every rank reaches:
  // one line with its text and the step; checkpoints committed before are kept.
  std::function<bool(const StepMetrics&)> on_step;
};

// What a profiled run wrote (this rank's files).
struct ProfileResult {
  std::string dir;                                 // profile.out
  std::string trace_path, svg_path, peaks_path;    // "" when no step was recorded
  std::string plan_path;  // plan_rank<r>.json: the planner's prediction for this rank
  int steps_recorded = 0;
  Peaks peaks;
  // MemTracker's peak of the total since the run began, read after the last recorded step. It
  // sees inside actions, which the trainer's own samples (taken between actions) do not.
  int64_t tracker_peak_bytes = 0;
};

struct TrainSummary {
  int steps = 0;
  double last_loss = 0;       // training loss of the last step
  double last_val_loss = -1;  // -1 when no validation ran
  double tokens_per_s = 0;    // mean over the run, excluding the first step
  double unigram_entropy = 0; // byte-unigram entropy of the training data, nats (for reference)
  int skipped_steps = 0;      // fp16: optimizer steps skipped because gradients overflowed
  int outer_steps = 0;        // local_sgd: outer steps (one per fragment synced)
  double loss_scale = 0;      // fp16: the loss scale at the end (0 otherwise)
  std::string weights_path;  // <run_dir>/hf; "" when not exported
  // Checkpoints (checkpoint block).
  int start_step = 0;          // > 0 when resumed
  std::string resumed_from;    // the step directory resumed from ("" = none)
  int checkpoints_saved = 0;   // committed by this run
  int checkpoints_failed = 0;
  int64_t last_checkpoint = -1;  // step of the last committed checkpoint
  double ckpt_stall_s = 0;     // total time the training thread spent checkpointing (rank 0)
  ProfileResult profile;       // profile block enabled: this rank's files and peaks
  bool stopped = false;        // on_step asked to stop before train_steps
};

TrainSummary train(const TrainConfig& cfg, const TrainOptions& opts = {});

// train() kept between calls (the facade, shardwise/trainer.h): the constructor does train()'s
// set-up (checks, communicators, data, model, resume or init_from); then the steps, validation,
// checkpoints and exports on the same model. Every call is collective, with train()'s errors
// (one rank: thrown; several: printed once, the job ended). `cfg` and `opts` are copied.
class TrainSession {
 public:
  TrainSession(const TrainConfig& cfg, const TrainOptions& opts);
  ~TrainSession();
  TrainSummary train();  // steps from step() to train_steps (or a stop), as train() does
  double evaluate();     // validation loss of the current weights; -1 without data.val
  // A synchronous checkpoint of the current state into checkpoint.dir (its step directory).
  std::string save_checkpoint();
  // The weights as a Hugging Face directory (built-in models) or, for a user model,
  // <dir>/model.safetensors (the names its units declare). Returns what was written.
  std::string export_weights(const std::string& dir);
  int step() const;  // optimizer steps done (the resumed step before the first train())
  const TrainConfig& config() const;  // as resolved ("auto" keys chosen)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What tensor parallelism (parallelism.tensor_parallel_degree > 1) does not do yet, refused
// in one line naming the key (sw::Error "config: <source>: <key>: ..."); nothing at degree 1.
// command "train" (train() calls it): checkpoint saves and resume, a device other than cpu,
// parameters offloaded to NVMe, "auto" keys (init_from and the end-of-run export work on
// logical tensors). Any other command (sample, eval: one rank) is refused whole.
void refuse_tensor_parallel_gaps(const TrainConfig& cfg, const std::string& command);

}  // namespace sw
