/// @file
/// @brief The Trainer: a training run driven from C++, as `shardwise train` drives it.
///
/// Build it from a RunConfig made in code or from a config file (the command `shardwise train`
/// is a thin user of this class); optionally give your own model (Units of your own,
/// shardwise/model.h) in place of the config's gpt2 / llama. Then train() with a per-step
/// callback, evaluate(), save_checkpoint(), export_weights(), and read summary().
///
/// Under `mpirun -np N` every rank constructs the Trainer and makes the same calls, in the same
/// order (they are collective); callbacks run on every rank. Errors: with one rank, sw::Error
/// (shardwise/error.h), one line naming the file or key, unit, parameter or step; with several,
/// as `shardwise train`: printed once and the job ends with exit code 1.
///
/// @code
///   sw::Trainer t(cfg);                          // or sw::Trainer::from_file("run.json")
///   t.on_step([](const sw::StepInfo& s) {
///     std::printf("step %d loss %.4f\n", s.step, s.loss);
///     return s.loss < 1.5 ? sw::StepAction::Stop : sw::StepAction::Continue;
///   });
///   const sw::RunSummary& r = t.train();
/// @endcode
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardwise/model.h"
#include "shardwise/run_config.h"

namespace sw {

/// One optimizer step, as metrics.jsonl records it (every rank gets the same values).
struct StepInfo {
  int step = 0;               ///< 1-based: the optimizer steps done
  int total_steps = 0;        ///< train_steps
  double loss = 0;            ///< mean training loss over the global batch
  double lr = 0;              ///< the learning rate the update used
  double grad_norm = 0;       ///< global gradient norm, before clipping
  double tokens_per_s = 0;    ///< this step's training throughput over all ranks
  bool has_val_loss = false;  ///< validated at this step (eval_every_steps, the last step)
  double val_loss = 0;        ///< the validation loss when has_val_loss
  bool skipped = false;       ///< fp16: the update was skipped (gradient overflow)
};

/// What a StepCallback asks for.
enum class StepAction {
  Continue,  ///< go on to the next step
  Stop,      ///< end the run after this step (see StepCallback)
};

/// Called after each step (its validation and periodic checkpoint included). Stop: the run
/// ends after this step as at its last one (a checkpoint when the checkpoint block is on, the
/// export unless turned off) and train() returns; with several ranks, any rank's Stop stops
/// all. A throw ends the run with one line "... step N: <its text>"; checkpoints committed
/// before stay as they were.
using StepCallback = std::function<StepAction(const StepInfo&)>;

/// Your model, for tensor rank slice.rank of slice.size ({0, 1} without tensor parallelism).
/// Called on every rank, when the run is set up. The config's model.vocab_size and
/// model.seq_len still give the data's vocabulary and the sequence length. Not yet with
/// "auto" keys, nor, split over tensor ranks or pipeline stages, with checkpoints or the
/// export (each refused in one line when the Trainer is built).
using ModelFactory = std::function<Model(const TensorSlice& slice)>;

/// How train() reports and ends.
struct TrainerOptions {
  bool progress = true;       ///< the live progress line on stderr (rank 0)
  bool export_at_end = true;  ///< train() exports the weights (export_weights("")) at the end
};

/// What the run did so far (summary(); train() returns it too).
struct RunSummary {
  int steps = 0;                 ///< the last step train() ran (0: none ran)
  int start_step = 0;            ///< the step resumed at (0: not resumed)
  std::string resumed_from;      ///< the step directory resumed from ("" = none)
  bool stopped = false;          ///< the callback asked to stop before train_steps
  double seconds = 0;            ///< train()'s time, set-up included
  double last_loss = 0;          ///< training loss of the last step
  double last_val_loss = -1;     ///< the last validation loss (-1: none ran)
  double tokens_per_s = 0;       ///< mean over the run, the first step left out
  double unigram_entropy = 0;    ///< byte-unigram entropy of the training data (nats)
  bool fp16 = false;             ///< the run trains in fp16 (loss scaling)
  double loss_scale = 0;         ///< fp16: the loss scale at the end
  int skipped_steps = 0;         ///< fp16: updates skipped on overflow
  int checkpoints_saved = 0;     ///< checkpoints committed by this Trainer
  int checkpoints_failed = 0;    ///< periodic saves that failed (the run went on)
  int64_t last_checkpoint = -1;  ///< step of the last committed checkpoint (-1: none)
  std::string checkpoint_dir;    ///< checkpoint.dir as resolved
  double checkpoint_stall_s = 0; ///< time the training thread spent checkpointing (rank 0)
  int profile_steps = 0;         ///< profile block: steps recorded into profile_dir
  std::string profile_dir;       ///< profile.out as resolved
  std::string weights_path;      ///< what the last export wrote ("" = not exported)
};

/// A training run: configuration, data, the sharded model and its optimizer state, kept
/// between calls. Movable, not copyable.
class Trainer {
 public:
  /// The run `config` describes, on the config's gpt2 / llama. Reads and checks the
  /// configuration now; the run is set up (data, communicators, model, resume) at the first
  /// call that needs it.
  explicit Trainer(const RunConfig& config, TrainerOptions options = {});
  /// The same on `model` (see ModelFactory): its parameter names and tensor splits are
  /// checked now too, on every rank alike, before any rank communicates.
  Trainer(const RunConfig& config, ModelFactory model, TrainerOptions options = {});
  /// A config file, with `shardwise train --set` overrides ("optimizer.params.lr=1e-3"): the
  /// same reader, the same errors.
  static Trainer from_file(const std::string& path, const std::vector<std::string>& overrides = {},
                           TrainerOptions options = {}, ModelFactory model = {});
  Trainer(Trainer&&) noexcept;             ///< takes over the run
  Trainer& operator=(Trainer&&) noexcept;  ///< takes over the run; this one's ends
  ~Trainer();                              ///< ends the run (nothing is saved)

  /// The per-step callback; before the run is set up (before any call below).
  void on_step(StepCallback callback);
  /// Starts from a checkpoint: a step directory, a checkpoint directory holding `latest`, or
  /// "auto" (checkpoint.resume's forms). Before the run is set up (before any call below).
  void resume(const std::string& dir);

  /// Trains from the current step to train_steps, or until the callback says Stop.
  const RunSummary& train();
  /// The validation loss of the current weights (data.val's eval_batches batches); throws when
  /// the config has no data.val.
  double evaluate();
  /// A checkpoint of the current step into checkpoint.dir (synchronous); returns its directory.
  std::string save_checkpoint();
  /// The weights: a Hugging Face directory for gpt2 / llama, `DIR/model.safetensors` for your
  /// own model. "" = `run_dir/hf`. Returns the path written.
  std::string export_weights(const std::string& dir = "");

  int step() const;                   ///< optimizer steps done (the resumed step included)
  const RunSummary& summary() const;  ///< what the run did so far
  std::string summary_text() const;   ///< what `shardwise train` prints at the end
  std::string config_json() const;    ///< the configuration as resolved (defaults included)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  explicit Trainer(std::unique_ptr<Impl> impl);
};

}  // namespace sw
