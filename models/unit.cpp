// Saved (activations kept from forward for backward) and Scratch (per-call temporaries).
#include "models/unit.h"

#include <algorithm>

#include "core/error.h"

namespace sw {

// ---- Saved ---------------------------------------------------------------------------------

void* Saved::slot(std::string_view key, size_t bytes, Keep keep) {
  auto it = bufs_.find(key);
  if (it != bufs_.end()) {
    it->second.keep = keep;
    if (it->second.buf.bytes() != bytes)  // size changed (another batch shape)
      it->second.buf = Buffer(bytes, Mem::Activations);
    return it->second.buf.data();
  }
  auto [pos, inserted] = bufs_.emplace(std::string(key), Slot{Buffer(bytes, Mem::Activations), keep});
  (void)inserted;
  return pos->second.buf.data();
}

float* Saved::f32(std::string_view key, size_t n, Keep keep) {
  return static_cast<float*>(slot(key, n * sizeof(float), keep));
}

int32_t* Saved::i32(std::string_view key, size_t n, Keep keep) {
  return static_cast<int32_t*>(slot(key, n * sizeof(int32_t), keep));
}

float* Saved::get(std::string_view key) const {
  auto it = bufs_.find(key);
  if (it == bufs_.end())
    fail("model", "no saved activation '" + std::string(key) +
                      "': backward ran without the matching forward");
  return it->second.buf.f32();
}

bool Saved::has(std::string_view key) const { return bufs_.find(key) != bufs_.end(); }

Saved& Saved::part(size_t j) {
  if (parts_.size() <= j) parts_.resize(j + 1);
  if (!parts_[j]) parts_[j] = std::make_unique<Saved>();
  return *parts_[j];
}

size_t Saved::bytes() const {
  size_t b = 0;
  for (const auto& kv : bufs_) b += kv.second.buf.bytes();
  for (const auto& p : parts_)
    if (p) b += p->bytes();
  return b;
}

size_t Saved::cheap_bytes() const {
  size_t b = 0;
  for (const auto& kv : bufs_)
    if (kv.second.keep == Keep::Cheap) b += kv.second.buf.bytes();
  for (const auto& p : parts_)
    if (p) b += p->cheap_bytes();
  return b;
}

void Saved::clear() {
  bufs_.clear();
  for (auto& p : parts_)
    if (p) p->clear();
}

size_t Saved::drop_cheap() {
  size_t b = 0;
  for (auto it = bufs_.begin(); it != bufs_.end();) {
    if (it->second.keep == Keep::Cheap) {
      b += it->second.buf.bytes();
      it = bufs_.erase(it);
    } else {
      ++it;
    }
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

// ---- Scratch -------------------------------------------------------------------------------
// Bump allocation in 64-byte (16-float) steps. When the last block is full a new, larger block
// is added, so pointers handed out earlier stay valid until reset(). The first request after a
// reset() with more than one block merges them into one block of the total size, so a steady
// state uses a single allocation.

namespace {
constexpr size_t kScratchAlign = 16;  // floats
size_t block_floats(const Buffer& b) { return b.bytes() / sizeof(float); }
}  // namespace

float* Scratch::f32(size_t n) {
  n = std::max<size_t>(1, (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign);
  if (used_ == 0 && blocks_.size() > 1) {
    size_t total = 0;
    for (const Buffer& b : blocks_) total += block_floats(b);
    blocks_.clear();
    blocks_.emplace_back(total * sizeof(float), Mem::Workspace);
  }
  if (blocks_.empty() || used_ + n > block_floats(blocks_.back())) {
    size_t cap = blocks_.empty() ? 0 : block_floats(blocks_.back());
    cap = std::max(n, 2 * cap);
    blocks_.emplace_back(cap * sizeof(float), Mem::Workspace);
    used_ = 0;
  }
  float* p = blocks_.back().f32() + used_;
  used_ += n;
  return p;
}

size_t Scratch::capacity_bytes() const {
  size_t b = 0;
  for (const Buffer& blk : blocks_) b += blk.bytes();
  return b;
}

}  // namespace sw
