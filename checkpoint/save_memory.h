// The host memory a rank's checkpoint save holds (sharded_checkpoint.cpp), in one place for
// the saver and the planner's RSS prediction (planner/search.h RssPrediction::checkpoint).
#pragma once
#include <algorithm>
#include <cstdint>

namespace sw {

// Synchronous saves copy the model's state (and checksum it) into a ring of staging chunks
// that the disk writes while the next is filled; the ring is mapped for the save alone.
inline constexpr int64_t kCkptStageChunk = int64_t{8} << 20;
inline constexpr int kCkptRing = 16;
inline constexpr int64_t kCkptAlign = 4096;  // O_DIRECT's (offload/aio.h kAioAlign)

// A rank's save of a `file_bytes` shard file: async, the snapshot image, held from set-up for
// the whole run (4096-aligned inside its buffer: a page more at most); sync, the staging ring
// while a save runs (no more chunks than the file fills).
inline int64_t checkpoint_save_bytes(int64_t file_bytes, bool async) {
  if (file_bytes <= 0) return 0;
  if (async) return (file_bytes + kCkptAlign - 1) / kCkptAlign * kCkptAlign + kCkptAlign;
  const int64_t chunks = (file_bytes + kCkptStageChunk - 1) / kCkptStageChunk;
  return std::min<int64_t>(kCkptRing, chunks) * kCkptStageChunk;
}

}  // namespace sw
