#include "sharding/flat_param.h"

#include "core/error.h"

namespace sw {

FlatLayout FlatLayout::build(std::vector<ParamSpec> specs, int world) {
  SW_CHECK(world >= 1, "world size must be positive");
  FlatLayout L;
  L.world = world;
  int64_t off = 0;
  for (const ParamSpec& s : specs) {
    const int64_t n = numel(s.shape);
    L.entries.push_back({off, n});
    off += (n + kAlign - 1) / kAlign * kAlign;
  }
  L.used = off;
  const int64_t q = kAlign * world;
  L.padded = (off + q - 1) / q * q;
  if (L.padded == 0) L.padded = q;  // a unit without parameters still has one aligned shard each
  L.specs = std::move(specs);
  return L;
}

}  // namespace sw
