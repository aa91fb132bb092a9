#include "sharding/flat_param.h"

#include <algorithm>

#include "core/error.h"

namespace sw {

namespace {
std::vector<std::pair<int64_t, int64_t>> replicated_of(const std::vector<ParamSpec>& specs,
                                                        const std::vector<FlatEntry>& entries) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (size_t s = 0; s < specs.size(); ++s) {
    if (specs[s].split.split() || entries[s].numel == 0) continue;
    const int64_t lo = entries[s].offset, hi = lo + entries[s].numel;
    // (joined when only an alignment gap, which stays zero, lies between)
    if (!runs.empty() && (lo - runs.back().second) < kAlign && [&] {
          for (size_t t = 0; t < specs.size(); ++t)
            if (specs[t].split.split() && entries[t].offset >= runs.back().second &&
                entries[t].offset < lo)
              return false;
          return true;
        }())
      runs.back().second = hi;
    else
      runs.emplace_back(lo, hi);
  }
  return runs;
}
}  // namespace

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
  // Runs: consecutive parameters alike in products_only, each from its first parameter's
  // offset to the next run's (the tail's padding joins the last run).
  int64_t compact = 0;
  for (size_t s = 0; s < L.specs.size(); ++s) {
    const bool f32 = !L.specs[s].products_only;
    if (!L.runs.empty() && (L.runs.back().f32 >= 0) == f32) continue;
    const int64_t lo = L.entries[s].offset;
    if (!L.runs.empty()) {
      L.runs.back().hi = lo;
      if (L.runs.back().f32 >= 0) compact += lo - L.runs.back().lo;
    }
    L.runs.push_back({lo, 0, f32 ? compact : -1});
  }
  if (L.runs.empty()) L.runs.push_back({0, 0, 0});
  L.runs.back().hi = L.padded;
  if (L.runs.back().f32 >= 0) compact += L.padded - L.runs.back().lo;
  L.compact = std::max(compact, kAlign);  // never empty: a unit's fp32 buffer always exists
  // Each parameter's place in it, once (the views are pointed at it on every gather). (An
  // empty parameter at the very end lies in no run: nothing to address.)
  for (FlatEntry& e : L.entries)
    for (const FlatRun& r : L.runs)
      if (e.offset >= r.lo && e.offset < r.hi && r.f32 >= 0) e.f32 = r.f32 + (e.offset - r.lo);
  L.replicated = replicated_of(L.specs, L.entries);
  return L;
}


}  // namespace sw
