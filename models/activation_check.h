// Measures what one call of a unit really allocates, in the terms of its declaration
// (models/unit.h, ActivationDecl), by running it once per call kind on the caller's buffers.
// Tests compare it with declare_activations() field by field; a user can check a custom unit
// the same way (examples/custom_model.cpp --check-activations).
#pragma once
#include <vector>

#include "models/unit.h"

namespace sw {

struct ActivationProbe {
  const Ops* ops = nullptr;
  const Batch* batch = nullptr;                 // tokens and targets (B, T)
  const std::vector<float*>* params = nullptr;  // the unit's parameters, ParamSpec order
  const std::vector<float*>* grads = nullptr;   // its gradient buffers (accumulated into)
  const float* x = nullptr;  // (B, T, d_model) input; null for an embedding call (no dx)
  int d_model = 0;
  bool loss_call = false;  // writes no y, gets no dy, never recomputed
  int vocab = 0;           // loss calls: width of the (B, V) logits of the inference pass
};

// Runs, each on a fresh Saved and with the same Scratch: forward (training, with gradient
// buffers), then, when the unit supports it and this is not a loss call, drop_cheap() and
// recompute_cheap(); backward; an inference forward; and for a loss call an inference forward
// with ctx.logits set. Returns the bytes observed (Saved::bytes() and cheap_bytes() after
// forward, Scratch::high_water() per call, the Mem::Activations peak of the inference
// passes). Resets MemTracker's peaks. The scratch must hold nothing (between calls).
ActivationDecl measure_activations(Unit& unit, int call, const ActivationProbe& probe,
                                   Scratch& scratch);

}  // namespace sw
