// fp16 loss scaling with DeepSpeed's semantics and config keys (the `fp16` block):
//   loss_scale           0 = dynamic; > 0 = a static scale that never changes
//   initial_scale_power  the dynamic scale starts at 2^p (default 16)
//   loss_scale_window    after this many consecutive steps without overflow the scale doubles
//                        (default 1000; the count restarts at every overflow, not at a doubling)
//   hysteresis           how many overflows are tolerated before the scale is halved
//                        (DeepSpeed's delayed_shift, default 2): an overflow while more than one
//                        is left only uses one up; an overflow with one left halves the scale.
//                        What is left is restored to `hysteresis` when the scale doubles, or
//                        after every good step with consecutive_hysteresis (default false).
//   min_loss_scale       the scale never falls below it (default 1); an overflow that would
//                        lower a scale already there is an error (DeepSpeed's
//                        raise_error_at_min_scale default), since training cannot progress.
// Every overflowing step is skipped by the trainer (engine/trainer.cpp), whatever the scaler
// does with the scale; a static scale only skips.
#pragma once
#include <cstdint>

namespace sw {

struct LossScalerConfig {
  double loss_scale = 0;         // fp16.loss_scale
  int initial_scale_power = 16;  // fp16.initial_scale_power
  int loss_scale_window = 1000;  // fp16.loss_scale_window
  int hysteresis = 2;            // fp16.hysteresis
  bool consecutive_hysteresis = false;  // fp16.consecutive_hysteresis
  double min_loss_scale = 1;     // fp16.min_loss_scale
};

// The scaler's state is the plain fields below, so a checkpoint can save and restore it.
struct LossScaler {
  LossScalerConfig cfg;
  double scale = 1;          // the current loss scale
  int64_t good_steps = 0;    // consecutive steps without overflow since the last overflow
  int hysteresis_left = 1;   // overflows left before the scale is halved (DeepSpeed's cur_hysteresis)

  LossScaler() = default;
  explicit LossScaler(const LossScalerConfig& c);  // scale = loss_scale or 2^initial_scale_power
  bool dynamic() const { return cfg.loss_scale <= 0; }
  // After a step's overflow check. Returns false when the step must be skipped (overflow).
  // Throws sw::Error("fp16: ...") when a dynamic scale at min_loss_scale overflows again.
  bool update(bool overflow);
};

}  // namespace sw
