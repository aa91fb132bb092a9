#include "engine/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace sw {

LossScaler::LossScaler(const LossScalerConfig& c) : cfg(c) {
  scale = dynamic() ? std::ldexp(1.0, c.initial_scale_power) : c.loss_scale;
  hysteresis_left = std::max(1, c.hysteresis);
}

bool LossScaler::update(bool overflow) {
  if (!dynamic()) return !overflow;
  const int hyst = std::max(1, cfg.hysteresis);
  if (overflow) {
    if (hysteresis_left <= 1) {
      if (scale <= cfg.min_loss_scale) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "%g", scale);
        fail("fp16", std::string("gradients overflow at the minimum loss scale (") + buf +
                         " = fp16.min_loss_scale); lower optimizer.params.lr, set "
                         "gradient_clipping or use bf16");
      }
      scale = std::max(scale / 2, cfg.min_loss_scale);
    } else {
      --hysteresis_left;
    }
    good_steps = 0;
    return false;
  }
  ++good_steps;
  if (cfg.consecutive_hysteresis) hysteresis_left = hyst;
  if (cfg.loss_scale_window > 0 && good_steps % cfg.loss_scale_window == 0) {
    hysteresis_left = hyst;
    scale *= 2;
  }
  return true;
}

}  // namespace sw
