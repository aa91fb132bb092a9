// Saved (activations kept from forward for backward) and Scratch (per-call temporaries).
#include "models/unit.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/ops.h"

namespace sw {

int64_t count_targets(const Batch& b) {
  if (b.counted >= 0) return b.counted;
  if (!b.targets) return 0;
  int64_t n = 0;
  const int64_t N = int64_t{b.B} * b.T;
  for (int64_t i = 0; i < N; ++i) n += b.targets[i] >= 0;
  return n;
}

void add_loss(UnitCtx& ctx, float* losses, float* dx, float* dw, const float* x, Operand w,
              int C, int V) {
  const Batch& b = *ctx.batch;
  const int N = b.B * b.T;
  if (ctx.loss_total)
    ctx.ops->lmhead_xent_into(ctx.loss_total, losses, dx, dw, x, w, b.targets, N, C, V,
                              ctx.grad_scale);
  else
    ctx.loss_sum += ctx.ops->lmhead_xent(losses, dx, dw, x, w, b.targets, N, C, V, ctx.grad_scale);
  ctx.loss_count += count_targets(b);
}

// ---- ProductIn -----------------------------------------------------------------------------

ProductIn keep_input(UnitCtx& ctx, ProductSlot slot, size_t n) {
  if (ctx.training) return saved_input(*ctx.saved, slot, n, *ctx.ops);
  return scratch_input(*ctx.scratch, n, *ctx.ops);
}

ProductIn saved_input(Saved& s, ProductSlot slot, size_t n, const Ops& ops) {
  if (lowp(ops)) return {nullptr, s.put(slot.lp(), n)};
  return {s.put(slot.f32(), n), nullptr};
}

ProductIn saved_input(const Saved& s, ProductSlot slot, const Ops& ops) {
  if (lowp(ops)) return {nullptr, s.get(slot.lp())};
  return {s.get(slot.f32()), nullptr};
}

ProductIn scratch_input(Scratch& s, size_t n, const Ops& ops) {
  if (lowp(ops)) return {nullptr, s.lp(n)};
  return {s.f32(n), nullptr};
}

void UnitCtx::zero_fresh(size_t i) const {
  grads_fresh[i] = 0;
  ops->fill((*grads)[i], 0.f, grads_n[i]);
}

// ---- Products with the residual stream added ------------------------------------------------

void linear_residual_to(const Ops& ops, float* y, Operand inp, Operand w, const float* b,
                        const float* res, int N, int C, int OC) {
  if (ops.fuses_product_residual()) return ops.linear_forward(y, inp, w, b, res, N, C, OC);
  ops.linear_forward(y, inp, w, b, nullptr, N, C, OC);
  ops.residual_forward(y, y, res, static_cast<size_t>(N) * static_cast<size_t>(OC));
}

void linear_residual_rmsnorm_to(const Ops& ops, float* y, ProductIn out, float* rstd,
                                Operand inp, Operand w, const float* b, const float* res,
                                const float* nw, int N, int C, int OC, float eps) {
  if (ops.fuses_product_residual()) {
    ops.linear_forward(y, inp, w, b, res, N, C, OC);
    return ops.rmsnorm_forward(out.out(), rstd, y, nw, N, OC, eps);
  }
  ops.linear_forward(y, inp, w, b, nullptr, N, C, OC);
  ops.rmsnorm_forward(out.out(), rstd, NormIn::residual(y, y, res), nw, N, OC, eps);
}

void linear_residual_layernorm_to(const Ops& ops, float* y, ProductIn out, float* mean,
                                  float* rstd, Operand inp, Operand w, const float* b,
                                  const float* res, const float* nw, const float* nb, int N,
                                  int C, int OC) {
  if (ops.fuses_product_residual()) {
    ops.linear_forward(y, inp, w, b, res, N, C, OC);
    return ops.layernorm_forward(out.out(), mean, rstd, y, nw, nb, N, OC);
  }
  ops.linear_forward(y, inp, w, b, nullptr, N, C, OC);
  ops.layernorm_forward(out.out(), mean, rstd, NormIn::residual(y, y, res), nw, nb, N, OC);
}

// ---- The residual stream's gradient --------------------------------------------------------

Operand dy_operand(const UnitCtx& ctx, const float* dy) {
  return ctx.grad16 && ctx.dy16 ? Operand(dy, ctx.grad16) : Operand(dy);
}

Operand dx_operand(const UnitCtx& ctx, const float* dx) {
  return ctx.grad16 && ctx.dx16 ? Operand(dx, ctx.grad16) : Operand(dx);
}

namespace {
// ctx.grad16 now holds narrow(dx), no longer narrow(dy).
void holds_dx16(UnitCtx& ctx) {
  ctx.dy16 = false;
  ctx.dx16 = true;
}
}  // namespace

void layernorm_backward_resid(UnitCtx& ctx, float* dx, float* dw, float* db, const float* dout,
                              const float* inp, const float* w, const float* mean,
                              const float* rstd, int N, int C) {
  ctx.ops->layernorm_backward(GradIn::add(dx, ctx.grad16), dw, db, dout, inp, w, mean, rstd, N,
                              C);
  if (ctx.grad16) holds_dx16(ctx);
}

void rmsnorm_backward_resid(UnitCtx& ctx, float* dx, float* dw, const float* dout,
                            const float* inp, const float* w, const float* rstd, int N, int C) {
  ctx.ops->rmsnorm_backward(GradIn::add(dx, ctx.grad16), dw, dout, inp, w, rstd, N, C);
  if (ctx.grad16) holds_dx16(ctx);
}

// ---- Saved ---------------------------------------------------------------------------------

void* Saved::put_bytes(uint16_t id, size_t bytes, uint8_t type, Keep keep, const char* name) {
  if (slots_.size() <= id) slots_.resize(size_t(id) + 1);
  Slot& sl = slots_[id];
  if (sl.type == 0 || sl.buf.bytes() != bytes)  // new, or another batch shape
    sl.buf = Buffer(bytes, Mem::Activations, device_);
  sl.keep = keep;
  sl.type = type;
  sl.name = name;
  return sl.buf.data();
}

void* Saved::get_bytes(uint16_t id, uint8_t type, const char* name) const {
  if (id >= slots_.size() || slots_[id].type == 0)
    fail("model", std::string("no saved activation '") + name +
                      "': backward ran without the matching forward");
  if (slots_[id].type != type)
    fail("model", std::string("saved activation '") + name +
                      "' read as another element type than forward kept");
  return slots_[id].buf.data();
}

void Saved::set(SavedFlag f, bool v) {
  if (flags_.size() <= f.id) flags_.resize(size_t(f.id) + 1, -1);
  flags_[f.id] = v ? 1 : 0;
}

bool Saved::flag(SavedFlag f) const {
  if (f.id >= flags_.size() || flags_[f.id] < 0)
    fail("model", std::string("no saved flag '") + f.name +
                      "': backward ran without the matching forward");
  return flags_[f.id] == 1;
}

Saved& Saved::part(size_t j) {
  if (parts_.size() <= j) parts_.resize(j + 1);
  if (!parts_[j]) {
    parts_[j] = std::make_unique<Saved>();
    parts_[j]->set_device(device_);
  }
  return *parts_[j];
}

size_t Saved::bytes() const {
  size_t b = 0;
  for (const Slot& sl : slots_) b += sl.buf.bytes();
  for (const auto& p : parts_)
    if (p) b += p->bytes();
  return b;
}

size_t Saved::cheap_bytes() const {
  size_t b = 0;
  for (const Slot& sl : slots_)
    if (sl.keep == Keep::Cheap) b += sl.buf.bytes();
  for (const auto& p : parts_)
    if (p) b += p->cheap_bytes();
  return b;
}

void Saved::clear() {
  slots_.clear();
  flags_.clear();
  for (auto& p : parts_)
    if (p) p->clear();
}

size_t Saved::move_to(Tier t, Device device, std::vector<std::shared_ptr<Event>>& done,
                      std::vector<Buffer>& from) {
  size_t moved = 0;
  for (Slot& sl : slots_) {
    Buffer& b = sl.buf;
    if (b.empty() || b.tier() == t) continue;
    Buffer nb(b.bytes(), Mem::Activations, t == Tier::Device ? device : Device::cpu(), t);
    moved += b.bytes();
    done.push_back(copy_bytes_async(nb.data(), nb.device(), b.data(), b.device(), b.bytes()));
    from.push_back(std::move(b));
    b = std::move(nb);
  }
  for (auto& p : parts_)
    if (p) moved += p->move_to(t, device, done, from);
  return moved;
}

std::vector<Buffer> Saved::detach() {
  std::vector<Buffer> out;
  for (Slot& sl : slots_) {
    if (sl.buf.empty()) continue;
    sl.detached = sl.buf.bytes();
    out.push_back(std::move(sl.buf));
    sl.buf = Buffer();
  }
  for (auto& p : parts_)
    if (p)
      for (Buffer& b : p->detach()) out.push_back(std::move(b));
  return out;
}

std::vector<Buffer*> Saved::reattach() {
  std::vector<Buffer*> out;
  for (Slot& sl : slots_) {
    if (sl.detached == 0) continue;
    sl.buf = Buffer(sl.detached, Mem::Activations, device_);
    sl.detached = 0;
    out.push_back(&sl.buf);
  }
  for (auto& p : parts_)
    if (p)
      for (Buffer* b : p->reattach()) out.push_back(b);
  return out;
}

size_t Saved::drop_cheap() {
  size_t b = 0;
  for (Slot& sl : slots_)
    if (sl.type != 0 && sl.keep == Keep::Cheap) {
      b += sl.buf.bytes();
      sl = Slot{};
    }
  for (auto& p : parts_)
    if (p) b += p->drop_cheap();
  return b;
}

// ---- Unit --------------------------------------------------------------------------------

void Unit::recompute_cheap(UnitCtx& ctx, int call, const float* x) {
  (void)ctx, (void)call, (void)x;
  fail("model", "unit '" + name() + "' has no selective recompute");
}

ActivationDecl Unit::declare_activations(int call, BatchShape shape) const {
  (void)call, (void)shape;
  ActivationDecl d;
  d.known = false;
  return d;
}

std::vector<TensorColl> Unit::declare_tensor_comm(int, Pass, BatchShape) const { return {}; }

ParamSpec param_spec(std::string name, Shape shape, Init init, float std, std::string hf,
                     bool hf_t) {
  ParamSpec p;
  p.name = std::move(name);
  p.weight_decay = shape.size() >= 2;
  p.shape = std::move(shape);
  p.init = init;
  p.std = std;
  p.hf_name = std::move(hf);
  p.hf_transpose = hf_t;
  return p;
}

const char* tensor_op_name(TensorOp op) {
  switch (op) {
    case TensorOp::GatherRows: return "tp_gather_rows";
    case TensorOp::ScatterRows: return "tp_scatter_rows";
    case TensorOp::AllGather: return "tp_all_gather";
  }
  return "?";
}

int64_t TensorSplit::logical_index(int64_t i, const std::vector<int64_t>& local) const {
  if (!split()) return i;
  // local is (rows..., cols) row-major; a 1-D tensor is one row of local[0] columns when it is
  // split by rows of length 1.
  const int64_t lcols = local.size() >= 2 ? numel(local) / local[0] : 1;
  const int64_t gcols = logical.size() >= 2 ? numel(logical) / logical[0] : 1;
  int64_t r = i / lcols;
  const int64_t c = i % lcols + (col_hi > 0 ? col_lo : 0);
  if (!rows.empty()) {
    for (const auto& run : rows) {
      const int64_t n = run[1] - run[0];
      if (r < n) {
        r += run[0];
        return r * gcols + c;
      }
      r -= n;
    }
    SW_CHECK(false, "TensorSplit: element beyond the rows held");
  }
  return r * gcols + c;
}

// ---- Scratch -------------------------------------------------------------------------------
// Bump allocation in 64-byte (16-float) steps. When the current block is full the next block
// that fits is used, or a new, larger one added, so pointers handed out earlier stay valid until
// reset(). The first request with nothing handed out (no Hold) merges several blocks into one of
// the total size, so a steady state uses a single allocation.

namespace {
size_t block_floats(const Buffer& b) { return b.bytes() / sizeof(float); }
}  // namespace

float* Scratch::f32(size_t n) {
  n = bytes_for(n) / sizeof(float);
  if (live_ == 0 && blocks_.size() > 1) {
    size_t total = 0;
    for (const Buffer& b : blocks_) total += block_floats(b);
    blocks_.clear();
    blocks_.emplace_back(total * sizeof(float), Mem::Workspace, device_);
    cur_ = off_ = 0;
  }
  if (blocks_.empty() || off_ + n > block_floats(blocks_[cur_])) {
    size_t next = blocks_.empty() ? 0 : cur_ + 1;
    while (next < blocks_.size() && block_floats(blocks_[next]) < n) ++next;
    if (next >= blocks_.size()) {
      const size_t cap = blocks_.empty() ? 0 : block_floats(blocks_.back());
      blocks_.emplace_back(std::max(n, 2 * cap) * sizeof(float), Mem::Workspace, device_);
      next = blocks_.size() - 1;
    }
    cur_ = next;
    off_ = 0;
  }
  float* p = blocks_[cur_].f32() + off_;
  off_ += n;
  live_ += n;
  high_ = std::max(high_, live_);
  return p;
}

void Scratch::reset() {
  cur_ = floor_.block;
  off_ = floor_.off;
  live_ = floor_.live;
}

void Scratch::reserve(size_t bytes) {
  SW_CHECK(live_ == 0 && floor_.live == 0, "Scratch::reserve with regions handed out");
  const size_t floats = bytes_for(bytes / sizeof(float) + (bytes % sizeof(float) != 0)) / sizeof(float);
  if (blocks_.size() == 1 && block_floats(blocks_[0]) >= floats) return;
  blocks_.clear();
  blocks_.emplace_back(floats * sizeof(float), Mem::Workspace, device_);
  cur_ = off_ = 0;
}

size_t Scratch::capacity_bytes() const {
  size_t b = 0;
  for (const Buffer& blk : blocks_) b += blk.bytes();
  return b;
}

}  // namespace sw
