#include "sharding/unit_grads.h"

#include <algorithm>

namespace sw {

void UnitGrads::init(const FlatLayout& layout, const Ops& ops, DType rdt, bool lazy, bool regap) {
  layout_ = &layout;
  ops_ = &ops;
  rdt_ = rdt;
  lazy_ = lazy;
  regap_ = regap;
  n_.resize(layout.entries.size());
  for (size_t s = 0; s < n_.size(); ++s) n_[s] = static_cast<size_t>(layout.entries[s].numel);
  point();
}

void UnitGrads::point() {
  ptrs_.resize(layout_->specs.size());
  for (size_t s = 0; s < ptrs_.size(); ++s)
    ptrs_[s] = data_ ? data_ + layout_->entries[s].offset : nullptr;
}

void UnitGrads::make_persistent(float* region) {
  const size_t P = static_cast<size_t>(layout_->padded);
  if (region) {
    data_ = region;
  } else {
    buf_ = Buffer(P * sizeof(float), Mem::Grads, ops_->device());
    data_ = buf_.f32();
    ops_->fill(data_, 0.f, P);
  }
  point();
}

void UnitGrads::allocate(Mem cat) {
  buf_ = Buffer(static_cast<size_t>(layout_->padded) * sizeof(float), cat, ops_->device());
  data_ = buf_.f32();
  point();
  if (!lazy_) {
    ops_->fill(data_, 0.f, static_cast<size_t>(layout_->padded));
    return;
  }
  zero_gaps();
  zero();
}

void UnitGrads::release() {
  buf_.release();
  data_ = nullptr;
  unwritten_ = round_pending_ = false;
  point();
}

void UnitGrads::zero_gaps() {
  int64_t at = 0;
  for (const FlatEntry& e : layout_->entries) {
    if (e.offset > at) ops_->fill(data_ + at, 0.f, static_cast<size_t>(e.offset - at));
    at = std::max(at, e.offset + e.numel);
  }
  if (layout_->padded > at)
    ops_->fill(data_ + at, 0.f, static_cast<size_t>(layout_->padded - at));
}

void UnitGrads::zero() {
  round_pending_ = false;
  if (!lazy_) {
    ops_->fill(data_, 0.f, static_cast<size_t>(layout_->padded));
    return;
  }
  if (regap_) zero_gaps();
  unwritten_ = true;
  fresh_.assign(n_.size(), 1);
}

void UnitGrads::round_now() const {
  if (!round_pending_) return;
  round_pending_ = false;
  ops_->round_to(rdt_, data_, static_cast<size_t>(layout_->padded));
}

void UnitGrads::round() const {
  write_unwritten();
  ops_->round_to(rdt_, data_, static_cast<size_t>(layout_->padded));
}

void UnitGrads::zero_unwritten() const {
  if (!unwritten_) return;
  unwritten_ = false;
  // The parameters still unwritten, zeroed: runs of consecutive ones in one fill each (the gaps
  // between them are zeros already).
  const size_t n = fresh_.size();
  for (size_t s = 0; s < n;) {
    if (!fresh_[s] || n_[s] == 0) {
      ++s;
      continue;
    }
    size_t e = s + 1;
    while (e < n && (fresh_[e] || n_[e] == 0)) ++e;
    const int64_t lo = layout_->entries[s].offset;
    int64_t hi = lo;
    for (size_t k = s; k < e; ++k)
      hi = std::max(hi, layout_->entries[k].offset + layout_->entries[k].numel);
    ops_->fill(data_ + lo, 0.f, static_cast<size_t>(hi - lo));
    s = e;
  }
  std::fill(fresh_.begin(), fresh_.end(), uint8_t{0});
}

void UnitGrads::open(UnitCtx& ctx) {
  round_now();  // the call adds into the rounded values (what is unwritten stays so)
  ctx.grads = &ptrs_;
  ctx.grads_fresh = unwritten_ ? fresh_.data() : nullptr;
  ctx.grads_n = unwritten_ ? n_.data() : nullptr;
}

}  // namespace sw
