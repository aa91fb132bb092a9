#include "models/activation_check.h"

#include <vector>

#include "core/error.h"

namespace sw {

ActivationDecl measure_activations(Unit& unit, int call, const ActivationProbe& pr,
                                   Scratch& scratch) {
  SW_CHECK(pr.ops && pr.batch && pr.params && pr.grads && pr.d_model > 0, "bad probe");
  SW_CHECK(!pr.loss_call || pr.vocab > 0, "a loss call's probe needs the vocabulary size");
  const size_t n = size_t(pr.batch->B) * size_t(pr.batch->T) * size_t(pr.d_model);
  std::vector<float> y(pr.loss_call ? 0 : n), dy(pr.loss_call ? 0 : n, 1e-3f),
      dx(pr.x ? n : 0), logits(pr.loss_call ? size_t(pr.batch->B) * size_t(pr.vocab) : 0);
  MemTracker& mt = MemTracker::global();
  ActivationDecl d;
  Saved saved;
  auto ctx = [&](Saved& s, bool training, bool grads) {
    UnitCtx c;
    c.ops = pr.ops;
    c.batch = pr.batch;
    c.params = pr.params;
    c.grads = grads ? pr.grads : nullptr;
    c.saved = &s;
    c.scratch = &scratch;
    c.training = training;
    return c;
  };
  auto begin = [&] {
    scratch.reset();
    scratch.reset_high_water();
  };
  // Training forward, as the engine runs it.
  begin();
  UnitCtx c = ctx(saved, true, true);
  unit.forward(c, call, pr.x, pr.loss_call ? nullptr : y.data());
  d.saved = saved.bytes();
  d.saved_cheap = saved.cheap_bytes();
  d.scratch_fwd = scratch.high_water();
  // Selective recompute of what drop_cheap() frees.
  if (!pr.loss_call && unit.selective_recompute() && saved.drop_cheap() > 0) {
    begin();
    c = ctx(saved, true, false);
    unit.recompute_cheap(c, call, pr.x);
    d.scratch_recompute = scratch.high_water();
  }
  begin();
  c = ctx(saved, true, true);
  unit.backward(c, call, pr.x, pr.loss_call ? nullptr : dy.data(), pr.x ? dx.data() : nullptr);
  d.scratch_bwd = scratch.high_water();
  saved.clear();
  // Inference: the loss (or a non-loss call's output), then the last position's logits.
  auto infer = [&](float* lg, size_t* saved_peak, size_t* scratch_peak) {
    Saved s;
    const size_t base = mt.current(Mem::Activations);
    mt.reset_peaks();
    begin();
    UnitCtx e = ctx(s, false, false);
    e.logits = lg;
    unit.forward(e, call, pr.x, pr.loss_call ? nullptr : y.data());
    *saved_peak = mt.peak(Mem::Activations) - base;
    *scratch_peak = scratch.high_water();
  };
  infer(nullptr, &d.saved_eval, &d.scratch_eval);
  if (pr.loss_call) {
    infer(logits.data(), &d.saved_logits, &d.scratch_logits);
  } else {
    d.saved_logits = d.saved_eval;
    d.scratch_logits = d.scratch_eval;
  }
  scratch.reset();
  return d;
}

}  // namespace sw
