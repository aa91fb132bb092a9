// One unit's parameters as one flat buffer (llm.c's tables): each ParamSpec gets an offset
// aligned to kAlign floats; the total is padded so it splits into `world` equal, aligned
// shards. shard_range() is the one function that says which slice a rank owns.
#pragma once
#include <cstdint>
#include <vector>

#include "models/unit.h"

namespace sw {

constexpr int64_t kAlign = 16;  // floats (64 bytes)

struct FlatEntry {
  int64_t offset = 0;  // floats from the buffer start
  int64_t numel = 0;
  int64_t f32 = -1;    // its offset in the compact fp32 buffer (FlatRun); -1: none there
};

// A stretch of the flat buffer whose parameters all have an fp32 compute copy, or all do not
// (ParamSpec::products_only), for a unit that keeps a 16-bit copy of its parameters: its fp32
// copy is then compact, the `f32` runs one after another (same alignment gaps, so an offset
// within a run is the same in both buffers).
struct FlatRun {
  int64_t lo = 0, hi = 0;  // [lo, hi) of the flat buffer; the runs cover [0, padded)
  int64_t f32 = -1;        // its offset in the compact fp32 buffer; -1: 16-bit only
};

struct FlatLayout {
  std::vector<ParamSpec> specs;
  std::vector<FlatEntry> entries;  // same order as specs
  int64_t used = 0;                // floats covered by parameters, alignment gaps included
  int64_t padded = 0;              // total floats, a multiple of world * kAlign
  int world = 1;
  std::vector<FlatRun> runs;       // products_only parameters (a 16-bit-only run) and the rest
  int64_t compact = 0;             // floats of the compact fp32 buffer (the f32 runs)

  static FlatLayout build(std::vector<ParamSpec> specs, int world);
  int64_t shard_size() const { return padded / world; }
  int64_t shard_offset(int rank) const { return shard_size() * rank; }
  // Floats of the flat buffer in 16-bit-only runs (padded - compact).
  int64_t lp_only() const { return padded - compact; }
  // Where parameter s starts in the compact fp32 buffer; -1 when it has no fp32 copy there.
  int64_t compact_offset(size_t s) const { return entries[s].f32; }
  // Tensor parallelism: the [lo, hi) runs of the flat buffer holding replicated parameters
  // (ParamSpec::split empty; in a model that is not split, all of them); adjacent ones
  // (alignment gaps between) merged. Made once by build (the norm and each step's
  // tp_reduce_grads read them).
  std::vector<std::pair<int64_t, int64_t>> replicated;
  const std::vector<std::pair<int64_t, int64_t>>& replicated_runs() const { return replicated; }
};

}  // namespace sw
