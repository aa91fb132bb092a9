// The pure decisions of the CUDA backend and the NCCL group, checked on any machine (label
// unit): which device a process takes (cuda_pick_device) and when NCCL refuses a set of ranks
// (nccl_refusal: no GPU, a device not the rank's own, two ranks on one GPU).
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_runtime.h"
#include "sharding/comm/nccl/nccl_group.h"

using namespace sw;

TEST_CASE("cuda_pick_device: local rank modulo the GPUs, or SHARDWISE_CUDA_DEVICE") {
  CHECK(cuda_pick_device(0, 0, nullptr) == 0);  // no GPU: cuda:0, nothing asked of a driver
  CHECK(cuda_pick_device(5, 0, "3") == 0);
  CHECK(cuda_pick_device(0, 4, nullptr) == 0);
  CHECK(cuda_pick_device(3, 4, nullptr) == 3);
  CHECK(cuda_pick_device(5, 4, nullptr) == 1);
  CHECK(cuda_pick_device(5, 4, "") == 1);
  CHECK(cuda_pick_device(5, 4, "2") == 2);
  CHECK_THROWS_WITH(cuda_pick_device(0, 2, "2"),
                    Catch::Contains("cuda: SHARDWISE_CUDA_DEVICE=2 is not a device index below 2"));
  CHECK_THROWS_AS(cuda_pick_device(0, 2, "-1"), Error);
  CHECK_THROWS_AS(cuda_pick_device(0, 2, "1x"), Error);
}

namespace {
GpuIdentity gpu_id(uint64_t host, const char* bus, uint8_t uuid_byte) {
  GpuIdentity g;
  g.host_hash = host;
  std::strncpy(g.bus_id, bus, sizeof g.bus_id - 1);
  g.uuid[0] = uuid_byte;
  g.uuid[15] = 0x5a;
  g.status = 1;
  return g;
}
}  // namespace

TEST_CASE("nccl_refusal: one GPU per rank is served, a shared GPU or a missing one is not") {
  CHECK(nccl_refusal({}) == "");
  CHECK(nccl_refusal({gpu_id(1, "0000:3b:00.0", 1)}) == "");
  // Two hosts, the same bus id on each: different GPUs.
  CHECK(nccl_refusal({gpu_id(1, "0000:3b:00.0", 1), gpu_id(2, "0000:3b:00.0", 2),
                      gpu_id(1, "0000:5e:00.0", 3)}) == "");
  // Same host and bus id: shared.
  CHECK(nccl_refusal({gpu_id(1, "0000:3b:00.0", 1), gpu_id(1, "0000:5e:00.0", 2),
                      gpu_id(1, "0000:3b:00.0", 3)}) ==
        "ranks 0 and 2 share a GPU (0000:3b:00.0)");
  // Same uuid (containers may hide the real bus ids): shared.
  CHECK_FALSE(nccl_refusal({gpu_id(1, "0000:01:00.0", 7), gpu_id(2, "0000:02:00.0", 7)}).empty());
  std::vector<GpuIdentity> ids = {gpu_id(1, "0000:3b:00.0", 1), gpu_id(2, "0000:3b:00.0", 2)};
  ids[1].status = 0;
  CHECK(nccl_refusal(ids) == "rank 1 has no CUDA device");
  ids[1].status = -1;
  CHECK(nccl_refusal(ids) == "rank 1 was asked for a CUDA device that is not its own");
  // All-zero uuids (not reported) do not count as equal.
  GpuIdentity a = gpu_id(1, "0000:01:00.0", 0), b = gpu_id(2, "0000:01:00.0", 0);
  a.uuid[15] = b.uuid[15] = 0;
  CHECK(nccl_refusal({a, b}) == "");
}
