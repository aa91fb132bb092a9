// Learning-rate schedules, following DeepSpeed's definitions of the same names so that their
// configs mean the same here. `step` is 0-based (the first optimizer step uses lr_at(0)).
//
//   W = warmup_num_steps, S = total_num_steps (0 = train_steps), r0 = warmup_min_ratio,
//   rc = cos_min_ratio, lr = optimizer.params.lr.
//   warmup (s < W):  lr * (r0 + (1 - r0) * g(s)),  g(s) = s / W            (warmup_type linear)
//                                                  g(s) = ln(s + 1) / ln(W) (warmup_type log;
//                                                         W = 1 counts as W = 2, as DeepSpeed)
//   WarmupCosineLR (s >= W): lr * (rc + (1 - rc) * (1 + cos(pi * p)) / 2),
//                  p = min(1, (s - W + 1) / (S - W))  -> the last step, s = S - 1, uses lr * rc;
//                  S == W: lr after warmup.
//   WarmupLR (s >= W): lr.
//   Constant: lr at every step.
#pragma once
#include "engine/config.h"

namespace sw {

// `train_steps` stands in for total_num_steps when that is 0.
float lr_at(const OptimizerConfig& opt, const SchedulerConfig& sched, int train_steps, int step);

}  // namespace sw
