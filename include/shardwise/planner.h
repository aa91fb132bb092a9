/// @file
/// @brief Predicts a training step's peak memory (and, given a hardware profile, its time)
/// for a Model on N ranks, without running it.
///
/// The memory planner builds the same step plan the engine runs and replays it: each unit's
/// parameters, gradients and optimizer state as the strategy shards them, and the activation
/// memory each call declares (Unit::declare_activations). A unit that does not declare is an
/// error naming it, unless PlanRequest::measure_unknown asks the planner to run each such
/// call once and use what it allocated.
///
/// @code
///   sw::api::PlanRequest req;
///   req.world = 8;
///   req.micro_batch = 8;
///   req.seq_len = 1024;
///   sw::api::PlanFigures f = sw::api::predict_step(make_my_model(), req);
///   std::printf("peak %lld bytes per rank\n", (long long)f.device_peak);
/// @endcode
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardwise/model.h"

namespace sw::api {

/// The run to plan: ranks, strategy and batch shape.
struct PlanRequest {
  int world = 1;                        ///< data-parallel ranks
  std::string strategy = "FULL_SHARD";  ///< as ShardedOptions::strategy
  int micro_batch = 1;                  ///< sequences per rank per micro-step (B)
  int seq_len = 0;                      ///< tokens per sequence (T); 0: the model's config.seq_len
  int accum = 1;                        ///< micro-steps per optimizer step
  /// A hardware profile (JSON, as `shardwise calibrate` writes it) to predict the step's time
  /// with; "" predicts memory only.
  std::string hardware_profile;
  /// Run the calls of units that do not declare their activation sizes once, instead of
  /// refusing them.
  bool measure_unknown = false;
};

/// One rank's predicted figures for one training step (bytes; seconds).
struct PlanFigures {
  int64_t device_peak = 0;   ///< the tracked device (CPU: process heap) peak, workspace included
  int64_t activations = 0;   ///< activation bytes held at that peak
  int64_t workspace = 0;     ///< kernel workspace held at the peak
  int64_t host = 0;          ///< host-tier bytes (offloaded state)
  int64_t nvme = 0;          ///< NVMe offload files
  int64_t rss = 0;           ///< the process's predicted resident set (CPU runs)
  bool timed = false;        ///< a hardware profile was given
  double step_seconds = 0;   ///< predicted step time (timed only)
  std::vector<std::string> measured;  ///< "unit call N" whose sizes were measured, not declared
};

/// Plans one training step of `model` (its config's d_model, vocab_size, n_layer and seq_len
/// describe its shapes for the kernel-workspace estimate). Throws sw::Error naming the first
/// unit that does not declare its activation sizes (unless measure_unknown), an unknown
/// strategy, or a malformed hardware profile.
PlanFigures predict_step(Model model, const PlanRequest& request);

}  // namespace sw::api
