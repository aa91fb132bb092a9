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
};

struct FlatLayout {
  std::vector<ParamSpec> specs;
  std::vector<FlatEntry> entries;  // same order as specs
  int64_t used = 0;                // floats covered by parameters, alignment gaps included
  int64_t padded = 0;              // total floats, a multiple of world * kAlign
  int world = 1;

  static FlatLayout build(std::vector<ParamSpec> specs, int world);
  int64_t shard_size() const { return padded / world; }
  int64_t shard_offset(int rank) const { return shard_size() * rank; }
};

}  // namespace sw
