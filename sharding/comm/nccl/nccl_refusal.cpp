// The pure part of the NCCL group's creation (nccl_group.h): whether the gathered identities
// let NCCL serve every rank. No CUDA or NCCL here, so the unit test runs anywhere.
#include <cstring>
#include <string>
#include <vector>

#include "sharding/comm/nccl/nccl_group.h"

namespace sw {

std::string nccl_refusal(const std::vector<GpuIdentity>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].status == 0) return "rank " + std::to_string(r) + " has no CUDA device";
    if (ranks[r].status != 1)
      return "rank " + std::to_string(r) + " was asked for a CUDA device that is not its own";
  }
  static const uint8_t kNoUuid[16] = {};
  for (size_t a = 0; a < ranks.size(); ++a)
    for (size_t b = a + 1; b < ranks.size(); ++b) {
      const GpuIdentity &x = ranks[a], &y = ranks[b];
      const bool same_uuid = std::memcmp(x.uuid, kNoUuid, 16) != 0 &&
                             std::memcmp(x.uuid, y.uuid, 16) == 0;
      const bool same_bus = x.host_hash == y.host_hash &&
                            std::strncmp(x.bus_id, y.bus_id, sizeof x.bus_id) == 0;
      if (same_uuid || same_bus)
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " share a GPU (" +
               std::string(x.bus_id, strnlen(x.bus_id, sizeof x.bus_id)) + ")";
    }
  return "";
}

}  // namespace sw
