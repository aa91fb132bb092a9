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

// The caching device allocator (core/device_cache.h behind cuda_runtime.cu): after one step of
// buffers, repeating the step takes every block from the cache (no cudaMalloc), the tracker's
// reserved bytes are the cache's, and release_cached() gives them back with cudaFree.
TEST_CASE("device buffers reuse cached blocks: no cudaMalloc after warm-up") {
  if (!cuda_cache_stats(0).caching) {
    WARN("SHARDWISE_CUDA_CACHING=0: nothing to check");
    return;
  }
  std::vector<float> host(1 << 16, 1.5f), back(host.size());
  const std::vector<size_t> sizes = {4, 1000, 4096, 300000, size_t{3} << 20, size_t{40} << 20};
  auto step = [&] {
    std::vector<Buffer> bufs;
    for (size_t s : sizes) bufs.emplace_back(s, Mem::Activations, Device::cuda(0));
    // Use one, so the reuse is exercised with real work on the legacy stream.
    cuda_copy_to_device(bufs[4].data(), host.data(), host.size() * 4);
    cuda_copy_to_host(back.data(), bufs[4].data(), host.size() * 4);
  };
  step();
  const DeviceCacheStats w = cuda_cache_stats(0);
  CHECK(MemTracker::global().reserved() >= w.reserved);  // the host pool adds its own (if any)
  for (int i = 0; i < 100; ++i) step();
  const DeviceCacheStats s = cuda_cache_stats(0);
  CHECK(s.raw_allocs == w.raw_allocs);
  CHECK(s.raw_frees == w.raw_frees);
  CHECK(s.reserved == w.reserved);
  CHECK(s.hits >= w.hits + 100 * sizes.size());
  CHECK(back == host);
  release_cached();
  CHECK(cuda_cache_stats(0).cached == 0);
}

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device: skipping the CUDA tests\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
