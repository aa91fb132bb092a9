// Saved (activations kept from forward for backward) and Scratch (per-call temporaries).
#include "models/unit.h"

#include <algorithm>

#include "core/error.h"

namespace sw {

// ---- Saved ---------------------------------------------------------------------------------

void* Saved::slot(std::string_view key, size_t bytes) {
  auto it = bufs_.find(key);
  if (it != bufs_.end()) {
    if (it->second.bytes() == bytes) return it->second.data();
    it->second = Buffer(bytes, Mem::Activations);  // size changed (another batch shape)
    return it->second.data();
  }
  auto [pos, inserted] = bufs_.emplace(std::string(key), Buffer(bytes, Mem::Activations));
  (void)inserted;
  return pos->second.data();
}

float* Saved::f32(std::string_view key, size_t n) {
  return static_cast<float*>(slot(key, n * sizeof(float)));
}

int32_t* Saved::i32(std::string_view key, size_t n) {
  return static_cast<int32_t*>(slot(key, n * sizeof(int32_t)));
}

float* Saved::get(std::string_view key) const {
  auto it = bufs_.find(key);
  if (it == bufs_.end())
    fail("model", "no saved activation '" + std::string(key) +
                      "': backward ran without the matching forward");
  return it->second.f32();
}

size_t Saved::bytes() const {
  size_t b = 0;
  for (const auto& kv : bufs_) b += kv.second.bytes();
  return b;
}

void Saved::clear() { bufs_.clear(); }

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
