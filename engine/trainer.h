// The training loop: data, micro-batches with gradient accumulation, clipping, AdamW with the
// LR schedule, periodic validation, metrics.jsonl, a live progress line, and the final
// weights exported to <run_dir>/model.safetensors with Hugging Face names.
#pragma once
#include <cstdint>
#include <string>

#include "engine/config.h"

namespace sw {

struct TrainOptions {
  bool progress = true;  // live progress line on stderr (step/total, loss, tokens/s, ETA)
  bool export_weights = true;
};

struct TrainSummary {
  int steps = 0;
  double last_loss = 0;       // training loss of the last step
  double last_val_loss = -1;  // -1 when no validation ran
  double tokens_per_s = 0;    // mean over the run, excluding the first step
  double unigram_entropy = 0; // byte-unigram entropy of the training data, nats (for reference)
  int skipped_steps = 0;      // fp16: optimizer steps skipped because gradients overflowed
  double loss_scale = 0;      // fp16: the loss scale at the end (0 otherwise)
  std::string weights_path;   // "" when not exported
  // Checkpoints (checkpoint block).
  int start_step = 0;          // > 0 when resumed
  std::string resumed_from;    // the step directory resumed from ("" = none)
  int checkpoints_saved = 0;   // committed by this run
  int checkpoints_failed = 0;
  int64_t last_checkpoint = -1;  // step of the last committed checkpoint
  double ckpt_stall_s = 0;     // total time the training thread spent checkpointing (rank 0)
};

TrainSummary train(const TrainConfig& cfg, const TrainOptions& opts = {});

}  // namespace sw
