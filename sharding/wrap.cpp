#include "sharding/wrap.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "core/error.h"

namespace sw {

namespace {

// Several blocks run as one unit. Its parameter list is the blocks' lists concatenated; each
// block sees the slice of ctx.params / ctx.grads that belongs to it and a Saved of its own
// (part j of the composite's Saved, so that activation checkpointing frees it with the rest).
// The intermediate residual streams of inference and the intermediate gradients of backward
// ping-pong between (B, T, d) buffers taken from ctx.scratch and held across the blocks' calls
// (one buffer for two blocks, two for more), so they are tracked and declared with the scratch.
class CompositeUnit final : public Unit {
 public:
  CompositeUnit(std::vector<std::unique_ptr<Unit>> kids, int d_model)
      : kids_(std::move(kids)), d_(d_model) {
    size_t n = 0;
    for (auto& k : kids_) {
      first_.push_back(n);
      n += k->params().size();
    }
    first_.push_back(n);
    for (size_t j = 0; j < kids_.size(); ++j) {  // the Saved slot of block j's input (j >= 1)
      std::string k = "x";  // (appended: GCC 12's -Wrestrict misfires on "x" + std::to_string)
      k += std::to_string(j);
      names_.push_back(std::move(k));
      SW_CHECK(j < 65536, "a composite unit of more than 65536 blocks");
    }
    kid_params_.resize(kids_.size());
    kid_params16_.resize(kids_.size());
    kid_grads_.resize(kids_.size());
  }

  std::string name() const override { return kids_.front()->name() + ".." + kids_.back()->name(); }

  std::vector<ParamSpec> params() const override {
    std::vector<ParamSpec> all;
    for (auto& k : kids_)
      for (ParamSpec& s : k->params()) all.push_back(std::move(s));
    return all;
  }

  void forward(UnitCtx& ctx, int call, const float* x, float* y) override {
    const size_t n = size_t(ctx.batch->B) * ctx.batch->T * d_;
    float* pp[2] = {nullptr, nullptr};
    if (!ctx.training) take_pingpong(*ctx.scratch, n, pp);
    Scratch::Hold hold(*ctx.scratch);
    const float* in = x;
    for (size_t j = 0; j < kids_.size(); ++j) {
      float* out;
      if (j + 1 == kids_.size()) {
        out = y;
      } else if (ctx.training) {
        out = ctx.saved->put(input_slot(j + 1), n);  // block j+1's input
      } else {
        out = pp[j % 2];
      }
      UnitCtx c = kid_ctx(ctx, j);
      ctx.scratch->reset();
      kids_[j]->forward(c, 0, in, out);
      ctx.loss_sum += c.loss_sum;
      ctx.loss_count += c.loss_count;
      if (!ctx.training) c.saved->clear();
      in = out;
    }
  }

  void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) override {
    const size_t n = size_t(ctx.batch->B) * ctx.batch->T * d_;
    float* pp[2] = {nullptr, nullptr};
    take_pingpong(*ctx.scratch, n, pp);
    Scratch::Hold hold(*ctx.scratch);
    const float* d_out = dy;
    bool d16 = ctx.dy16;  // ctx.grad16 holds narrow(d_out) (UnitCtx::grad16)
    for (size_t j = kids_.size(); j-- > 0;) {
      const float* in = j == 0 ? x : ctx.saved->get(input_slot(j));
      float* d_in = j == 0 ? dx : pp[j % 2];
      UnitCtx c = kid_ctx(ctx, j);
      c.dy16 = d16;
      c.dx16 = false;
      ctx.scratch->reset();
      kids_[j]->backward(c, 0, in, d_out, d_in);
      c.saved->clear();
      d_out = d_in;
      d16 = c.dx16;
    }
    ctx.dx16 = d16;
  }

  // Saved: the blocks' (as parts) plus the inputs of blocks 1.. (K-1 residual streams).
  // Scratch: the blocks run one at a time, so the largest block's, plus the held ping-pong
  // buffers in inference and backward.
  ActivationDecl declare_activations(int /*call*/, BatchShape shape) const override {
    const size_t n = size_t(shape.B) * size_t(shape.T) * size_t(d_);
    const size_t held = num_pingpong() * Scratch::bytes_for(n);
    ActivationDecl d;
    d.saved = (kids_.size() - 1) * n * sizeof(float);
    for (const auto& k : kids_) {
      const ActivationDecl e = k->declare_activations(0, shape);
      d.known = d.known && e.known;
      d.saved += e.saved;
      d.saved_cheap += e.saved_cheap;
      d.scratch_fwd = std::max(d.scratch_fwd, e.scratch_fwd);
      d.scratch_bwd = std::max(d.scratch_bwd, e.scratch_bwd);
      d.scratch_recompute = std::max(d.scratch_recompute, e.scratch_recompute);
      d.saved_eval = std::max(d.saved_eval, e.saved_eval);  // cleared after each block
      d.scratch_eval = std::max(d.scratch_eval, e.scratch_eval);
      d.saved_logits = std::max(d.saved_logits, e.saved_logits);
      d.scratch_logits = std::max(d.scratch_logits, e.scratch_logits);
    }
    d.scratch_bwd += held;
    d.scratch_eval += held;
    d.scratch_logits += held;
    return d;
  }

  // The blocks' collectives, one block after another (backward: the last block's first).
  std::vector<TensorColl> declare_tensor_comm(int /*call*/, Pass pass,
                                              BatchShape shape) const override {
    std::vector<TensorColl> all;
    for (size_t j = 0; j < kids_.size(); ++j) {
      const size_t k = pass == Pass::Backward ? kids_.size() - 1 - j : j;
      for (const TensorColl& c : kids_[k]->declare_tensor_comm(0, pass, shape)) all.push_back(c);
    }
    return all;
  }

  // Selective checkpointing: each block rebuilds its own cheap buffers from its saved input.
  bool selective_recompute() const override {
    for (const auto& k : kids_)
      if (!k->selective_recompute()) return false;
    return true;
  }
  void recompute_cheap(UnitCtx& ctx, int /*call*/, const float* x) override {
    for (size_t j = 0; j < kids_.size(); ++j) {
      UnitCtx c = kid_ctx(ctx, j);
      ctx.scratch->reset();
      kids_[j]->recompute_cheap(c, 0, j == 0 ? x : ctx.saved->get(input_slot(j)));
    }
  }

 private:
  UnitCtx kid_ctx(const UnitCtx& ctx, size_t j) {
    kid_params_[j].assign(ctx.params->begin() + long(first_[j]),
                          ctx.params->begin() + long(first_[j + 1]));
    if (ctx.params16)
      kid_params16_[j].assign(ctx.params16->begin() + long(first_[j]),
                              ctx.params16->begin() + long(first_[j + 1]));
    if (ctx.grads)
      kid_grads_[j].assign(ctx.grads->begin() + long(first_[j]),
                           ctx.grads->begin() + long(first_[j + 1]));
    UnitCtx c = ctx;
    c.params = &kid_params_[j];
    c.params16 = ctx.params16 ? &kid_params16_[j] : nullptr;
    c.grads = ctx.grads ? &kid_grads_[j] : nullptr;
    if (ctx.grads_fresh) {  // the same flags, from this block's first parameter on
      c.grads_fresh = ctx.grads_fresh + first_[j];
      c.grads_n = ctx.grads_n + first_[j];
    }
    c.saved = &ctx.saved->part(j);
    c.loss_sum = 0;
    c.loss_count = 0;
    return c;
  }

  // Intermediate streams: blocks 0..K-2 write (forward) or blocks K-1..1 write (backward) one;
  // consecutive blocks alternate between two buffers, so two blocks need only one.
  size_t num_pingpong() const { return std::min<size_t>(2, kids_.size() - 1); }
  void take_pingpong(Scratch& s, size_t n, float* pp[2]) const {
    pp[0] = s.f32(n);
    pp[1] = num_pingpong() == 2 ? s.f32(n) : pp[0];
  }

  std::vector<std::unique_ptr<Unit>> kids_;
  int d_;
  std::vector<std::string> names_;  // of the slots below, for messages
  SavedSlot<float> input_slot(size_t j) const {
    return {static_cast<uint16_t>(j), Keep::Always, names_[j].c_str()};
  }
  std::vector<size_t> first_;  // index of each block's first spec; last entry = total
  std::vector<std::vector<float*>> kid_params_, kid_grads_;
  std::vector<std::vector<const uint16_t*>> kid_params16_;
};

}  // namespace

void wrap_blocks(Model& model, int blocks_per_unit) {
  if (blocks_per_unit <= 1) return;
  const size_t P = model.schedule.size(), U = model.units.size();
  std::vector<int> uses(U, 0);
  for (const Call& c : model.schedule) {
    if (c.unit < 0 || c.unit >= int(U))
      fail("wrap", "schedule names unit " + std::to_string(c.unit));
    uses[size_t(c.unit)]++;
  }
  auto is_block = [&](size_t p) {
    const Call& c = model.schedule[p];
    return p > 0 && p + 1 < P && uses[size_t(c.unit)] == 1 &&
           model.units[size_t(c.unit)]->num_calls() == 1;
  };
  // Chunks of schedule positions [lo, hi) to merge.
  std::vector<std::pair<size_t, size_t>> chunks;
  for (size_t p = 0; p < P;) {
    if (!is_block(p)) {
      ++p;
      continue;
    }
    size_t end = p;
    while (end < P && is_block(end)) ++end;
    for (size_t lo = p; lo < end; lo += size_t(blocks_per_unit)) {
      const size_t hi = std::min(end, lo + size_t(blocks_per_unit));
      if (hi - lo > 1) chunks.push_back({lo, hi});
    }
    p = end;
  }
  if (chunks.empty()) return;

  // Old unit index -> chunk it is merged into (-1: stays alone).
  std::vector<int> chunk_of(U, -1);
  for (size_t k = 0; k < chunks.size(); ++k)
    for (size_t p = chunks[k].first; p < chunks[k].second; ++p)
      chunk_of[size_t(model.schedule[p].unit)] = int(k);

  // New units: each composite takes the place of its first block (in unit order).
  std::vector<std::unique_ptr<Unit>> units;
  std::vector<int> new_index(U, -1);
  std::vector<int> chunk_index(chunks.size(), -1);
  for (size_t u = 0; u < U; ++u) {
    const int k = chunk_of[u];
    if (k < 0) {
      new_index[u] = int(units.size());
      units.push_back(std::move(model.units[u]));
      continue;
    }
    if (chunk_index[size_t(k)] >= 0) {
      new_index[u] = chunk_index[size_t(k)];
      continue;
    }
    std::vector<std::unique_ptr<Unit>> kids;
    for (size_t p = chunks[size_t(k)].first; p < chunks[size_t(k)].second; ++p)
      kids.push_back(std::move(model.units[size_t(model.schedule[p].unit)]));
    chunk_index[size_t(k)] = int(units.size());
    new_index[u] = chunk_index[size_t(k)];
    units.push_back(std::make_unique<CompositeUnit>(std::move(kids), model.residual_width()));
  }
  // Blocks merged before their own index was reached map to their composite too.
  for (size_t u = 0; u < U; ++u)
    if (chunk_of[u] >= 0) new_index[u] = chunk_index[size_t(chunk_of[u])];

  std::vector<Call> schedule;
  for (size_t p = 0; p < P; ++p) {
    const int k = chunk_of[size_t(model.schedule[p].unit)];
    if (k >= 0 && chunks[size_t(k)].first != p) continue;  // the composite runs once
    schedule.push_back(
        {new_index[size_t(model.schedule[p].unit)], k >= 0 ? 0 : model.schedule[p].call});
  }
  model.units = std::move(units);
  model.schedule = std::move(schedule);
}

}  // namespace sw
