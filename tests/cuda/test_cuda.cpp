// CUDA backend tests: run where a GPU exists; where none does, main() exits 77, which ctest
// reports as "skipped" (not passed, not failed).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include <vector>

#include "core/alloc.h"
#include "kernels/cuda/cuda_runtime.h"

using namespace sw;

TEST_CASE("device buffers round-trip through the registered CUDA allocator") {
  const size_t before = MemTracker::global().current(Mem::Params);
  std::vector<float> host(1000), back(1000, 0.f);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  {
    Buffer dev(host.size() * 4, Mem::Params, Device::cuda(0));
    CHECK(MemTracker::global().current(Mem::Params) == before + 4000);
    cuda_copy_to_device(dev.data(), host.data(), 4000);
    cuda_copy_to_host(back.data(), dev.data(), 4000);
  }
  CHECK(back == host);
  CHECK(MemTracker::global().current(Mem::Params) == before);
}

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device: skipping the CUDA tests\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
