#include "engine/schedule.h"

#include <algorithm>
#include <cmath>

namespace sw {

float lr_at(const OptimizerConfig& opt, const SchedulerConfig& sched, int train_steps, int step) {
  const double lr = opt.lr;
  if (sched.type == "Constant") return static_cast<float>(lr);
  const int W = sched.warmup_num_steps;
  if (step < W) {
    double g;
    if (sched.warmup_type == "log")
      g = std::log(step + 1.0) / std::log(std::max(W, 2) * 1.0);
    else
      g = static_cast<double>(step) / W;
    const double r0 = sched.warmup_min_ratio;
    return static_cast<float>(lr * (r0 + (1.0 - r0) * g));
  }
  if (sched.type == "WarmupLR") return static_cast<float>(lr);
  // WarmupCosineLR
  const int S = sched.total_num_steps > 0 ? sched.total_num_steps : train_steps;
  if (S <= W) return static_cast<float>(lr);
  const double p = std::min(1.0, static_cast<double>(step - W + 1) / (S - W));
  const double rc = sched.cos_min_ratio;
  const double pi = 3.14159265358979323846;
  return static_cast<float>(lr * (rc + (1.0 - rc) * 0.5 * (1.0 + std::cos(pi * p))));
}

}  // namespace sw
