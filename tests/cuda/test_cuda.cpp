// CUDA backend tests: run where a GPU exists; where none does, main() exits 77, which ctest
// reports as "skipped" (not passed, not failed).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>

#include <vector>

#include "core/alloc.h"
#include "core/stream.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"
#include "tests/cuda/cuda_test_util.h"

using namespace sw;
using namespace sw::test;

TEST_CASE("device buffers round-trip through the registered CUDA allocator") {
  const size_t before = MemTracker::global().current(Mem::Params);
  std::vector<float> host(1000), back(1000, 0.f);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  {
    Buffer dev(host.size() * 4, Mem::Params, gpu());
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
  if (!cuda_cache_stats(cuda_current_device()).caching) {
    WARN("SHARDWISE_CUDA_CACHING=0: nothing to check");
    return;
  }
  std::vector<float> host(1 << 16, 1.5f), back(host.size());
  const std::vector<size_t> sizes = {4, 1000, 4096, 300000, size_t{3} << 20, size_t{40} << 20};
  auto step = [&] {
    std::vector<Buffer> bufs;
    for (size_t s : sizes) bufs.emplace_back(s, Mem::Activations, gpu());
    // Use one, so the reuse is exercised with real work on the legacy stream.
    cuda_copy_to_device(bufs[4].data(), host.data(), host.size() * 4);
    cuda_copy_to_host(back.data(), bufs[4].data(), host.size() * 4);
  };
  step();
  const DeviceCacheStats w = cuda_cache_stats(cuda_current_device());
  CHECK(MemTracker::global().reserved() >= w.reserved);  // the host pool adds its own (if any)
  for (int i = 0; i < 100; ++i) step();
  const DeviceCacheStats s = cuda_cache_stats(cuda_current_device());
  CHECK(s.raw_allocs == w.raw_allocs);
  CHECK(s.raw_frees == w.raw_frees);
  CHECK(s.reserved == w.reserved);
  CHECK(s.hits >= w.hits + 100 * sizes.size());
  CHECK(back == host);
  release_cached();
  CHECK(cuda_cache_stats(cuda_current_device()).cached == 0);
}

TEST_CASE("ops_for names this process's device and refuses the others") {
  CHECK(ops_for(gpu()).device() == gpu());
  CHECK_THROWS(ops_for(Device::cuda(cuda_current_device() + 1)));
  CHECK(cuda_compute_stream(cuda_current_device()) == ops_for(gpu()).stream().native_handle());
  CHECK(cuda_compute_stream(cuda_current_device()) != nullptr);
}

TEST_CASE("copy_bytes: host to device, device to device, device to host, complete on return") {
  const size_t n = size_t{5} << 20;
  std::vector<uint8_t> h = payload(n / 4, DType::F32, 3);
  Buffer a(n, Mem::Workspace, gpu()), b(n, Mem::Workspace, gpu());
  copy_bytes(a.data(), gpu(), h.data(), Device::cpu(), n);
  copy_bytes(b.data(), gpu(), a.data(), gpu(), n);
  std::vector<uint8_t> back(n, 0);
  copy_bytes(back.data(), Device::cpu(), b.data(), gpu(), n);
  CHECK(back == h);
}

// A CudaEvent recorded on a held stream is not complete; the compute stream waits for it on the
// device (wait_event returns at once); work enqueued after it runs after the held work.
TEST_CASE("CudaEvent: ordering across streams without blocking the host") {
  const int dev = cuda_current_device();
  const Ops& ops = ops_for(gpu());
  cudaStream_t side = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  const size_t n = 4096;
  Buffer x(n * 4, Mem::Workspace, gpu()), three(n * 4, Mem::Workspace, gpu());
  ops.fill(x.f32(), 1.f, n);
  ops.fill(three.f32(), 3.f, n);
  // Every kernel used behind the gate runs once before it: CUDA loads a module lazily at its
  // first launch, which can wait for the device, that is for the spinning gate.
  ops.scale(three.f32(), 1.f, n);
  ops.stream().synchronize();
  {
    Watchdog dog("CudaEvent gate test", 60);
    StreamGate gate(side);
    // On the side stream, after the gate: x := 3 (a device-to-device copy: a copy from
    // pageable host memory could make the host wait for the held stream).
    REQUIRE(cudaMemcpyAsync(x.data(), three.data(), n * 4, cudaMemcpyDeviceToDevice, side) ==
            cudaSuccess);
    std::shared_ptr<CudaEvent> e = cuda_record_event(side, dev);
    cuda_record_stream(x.data(), side, dev);
    CHECK(e->native_handle() != nullptr);
    CHECK_FALSE(e->query());
    const auto t0 = std::chrono::steady_clock::now();
    ops.stream().wait_event(*e);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
    ops.scale(x.f32(), 2.f, n);  // must see 3, not 1
    CHECK_FALSE(e->query());
    gate.open();
    e->synchronize();
    CHECK(e->query());
    ops.stream().synchronize();
  }
  std::vector<float> got(n);
  copy_bytes(got.data(), Device::cpu(), x.data(), gpu(), n * 4);
  CHECK(got == std::vector<float>(n, 6.f));
  // x was used on `side` (cuda_record_stream): freed while the stream lives, since the cache
  // records an event on it at the free (destroying the stream first crashed the H200 run of
  // 2026-11-27 inside cudaEventRecord).
  x.release();
  cudaStreamDestroy(side);
}

TEST_CASE("timed events on the compute stream measure the device's work, not its issue") {
  // Stream::record_timed / Event::elapsed_since (the profiler's device timeline): 24 passes
  // over 256 MB take the device milliseconds (12 GB of traffic; ~4 ms on an H100) while the
  // host issues them in far less; the measured rate must lie between 50 GB/s and 20 TB/s.
  const Ops& ops = ops_for(gpu());
  Stream& s = ops.stream();
  const size_t n = size_t{64} << 20;
  Buffer x(n * 4, Mem::Workspace, gpu());
  ops.fill(x.f32(), 1.f, n);
  ops.scale(x.f32(), 1.f, n);
  s.synchronize();
  const std::shared_ptr<Event> e0 = s.record_timed();
  const auto h0 = std::chrono::steady_clock::now();
  for (int k = 0; k < 24; ++k) ops.scale(x.f32(), 1.f, n);
  const double issue = std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count();
  const std::shared_ptr<Event> e1 = s.record_timed();
  const double dev = e1->elapsed_since(*e0);
  const double bytes = 24.0 * 2 * 4 * double(n);
  INFO("device " << dev * 1e3 << " ms for " << bytes / 1e9 << " GB, host issue " << issue * 1e3
                 << " ms");
  CHECK(dev > 0);
  CHECK(bytes / dev < 20e12);
  CHECK(bytes / dev > 50e9);
  // An event made without timing, or by the host, cannot be timed against these.
  CHECK_THROWS(e1->elapsed_since(*s.record()));
  StampedEvent host;
  CHECK_THROWS(e1->elapsed_since(host));
}

TEST_CASE("timed events on the copy streams time a copy's work against the compute stream's") {
  // The profiler's device timeline of an asynchronous copy (issue 39): while stream_timing() is
  // held, a copy's event carries timed events recorded on its copy stream around it
  // (Event::timed_span), and cudaEventElapsedTime times them against a reference on the
  // compute stream (any two timed events of one device). A copy made after 24 passes over
  // 256 MB starts on the device only after them (it waits for the compute stream's work so
  // far) and moves its 64 MiB in a positive time below 1 TB/s (no host link is faster); both
  // directions, each on its stream; a copy issued without the hold has no span.
  const Ops& ops = ops_for(gpu());
  Stream& s = ops.stream();
  const size_t n = size_t{64} << 20, c = size_t{16} << 20;  // floats: 256 MB, 64 MiB
  Buffer x(n * 4, Mem::Workspace, gpu()), d(c * 4, Mem::Workspace, gpu());
  Buffer h(c * 4, Mem::Workspace, Device::cpu(), Tier::Host);
  REQUIRE(host_pinned(h.data()));
  ops.fill(x.f32(), 1.f, n);
  s.synchronize();
  CHECK(copy_bytes_async(d.data(), gpu(), h.data(), Device::cpu(), c * 4)->timed_span().begin ==
        nullptr);
  hold_stream_timing(true);
  const std::shared_ptr<Event> ref = s.record_timed();
  for (int k = 0; k < 24; ++k) ops.scale(x.f32(), 1.f, n);
  const std::shared_ptr<Event> busy = s.record_timed();
  const std::shared_ptr<Event> up = copy_bytes_async(d.data(), gpu(), h.data(), Device::cpu(), c * 4);
  const std::shared_ptr<Event> down =
      copy_bytes_async(h.data(), Device::cpu(), d.data(), gpu(), c * 4, up.get());
  hold_stream_timing(false);
  const double compute_done = busy->elapsed_since(*ref);
  double prev_end = 0;
  for (const auto& [e, name] : {std::pair{up, "copy h2d"}, std::pair{down, "copy d2h"}}) {
    const Event::TimedSpan t = e->timed_span();
    REQUIRE(t.begin != nullptr);
    REQUIRE(t.end != nullptr);
    CHECK(std::string(t.stream) == name);
    const double b = t.begin->elapsed_since(*ref), en = t.end->elapsed_since(*ref);
    INFO(name << ": " << b * 1e3 << ".." << en * 1e3 << " ms after the reference; the compute "
              "work ended at " << compute_done * 1e3 << " ms");
    CHECK(b >= compute_done - 1e-6);
    CHECK(b >= prev_end - 1e-6);  // the download waited for the upload
    CHECK(en > b);
    CHECK(double(c * 4) / (en - b) < 1e12);
    prev_end = en;
  }
  CHECK_THROWS(up->timed_span().end->elapsed_since(*s.record()));
}

// The copy streams (copy_bytes_async): by default a copy starts after the compute stream's work
// so far; with an event, after that event only; the compute stream waits for a copy natively.
// Pinned host buffers (Tier::Host, > 1 MiB), so no copy makes the host wait for a held stream.
TEST_CASE("copy_bytes_async: ordered after the compute stream or an event, waited natively") {
  const int dev = cuda_current_device();
  const Ops& ops = ops_for(gpu());
  const size_t n = size_t{1} << 19;  // 2 MiB of floats
  Buffer x(n * 4, Mem::Workspace, gpu()), y(n * 4, Mem::Workspace, gpu());
  Buffer h(n * 4, Mem::Workspace, Device::cpu(), Tier::Host), h2(n * 4, Mem::Workspace,
                                                                  Device::cpu(), Tier::Host);
  REQUIRE(host_pinned(h.data()));
  ops.fill(x.f32(), 1.f, n);
  ops.stream().synchronize();
  std::shared_ptr<Event> down;
  {
    Watchdog dog("copy_bytes_async gate test (compute stream held)", 60);
    StreamGate gate(ops.stream().native_handle());  // the compute stream is held
    ops.fill(x.f32(), 5.f, n);                       // queued behind the gate
    down = copy_bytes_async(h.data(), Device::cpu(), x.data(), gpu(), n * 4);
    CHECK_FALSE(down->query());  // waits for the held compute work
    gate.open();
    down->synchronize();
  }
  CHECK(h.f32()[0] == 5.f);
  CHECK(h.f32()[n - 1] == 5.f);
  // Up, then the compute stream waits for it natively and scales: y = 2 * 3.
  for (size_t i = 0; i < n; ++i) h2.f32()[i] = 2.f;
  auto up = copy_bytes_async(y.data(), gpu(), h2.data(), Device::cpu(), n * 4);
  ops.stream().wait_event(*up);
  ops.scale(y.f32(), 3.f, n);
  std::vector<float> got(n);
  copy_bytes(got.data(), Device::cpu(), y.data(), gpu(), n * 4);
  CHECK(got == std::vector<float>(n, 6.f));
  // After a given event only: a held side stream's event holds the copy, not the compute work.
  cudaStream_t side = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  {
    Watchdog dog("copy_bytes_async gate test (side stream held)", 60);
    StreamGate gate(side);
    std::shared_ptr<CudaEvent> e = cuda_record_event(side, dev);
    auto c = copy_bytes_async(h.data(), Device::cpu(), y.data(), gpu(), n * 4, e.get());
    ops.fill(x.f32(), 7.f, n);
    ops.stream().synchronize();  // the compute stream does not wait for the held copy
    CHECK_FALSE(c->query());
    gate.open();
    c->synchronize();
  }
  CHECK(h.f32()[0] == 6.f);
  cudaStreamDestroy(side);
}

TEST_CASE("Tier::Host pool blocks are pinned once the process uses its GPU") {
  (void)cuda_current_device();  // registers host pinning
  const size_t n = (size_t{9} << 20) + 12345;  // a size no earlier case left in the pool
  Buffer h(n, Mem::Optimizer, Device::cpu(), Tier::Host);
  CHECK(host_pinned(h.data()));
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, h.data()) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeHost);
  Buffer d(n, Mem::Optimizer, Device::cpu(), Tier::Device);  // the Device tier: not pinned
  CHECK_FALSE(host_pinned(d.data()));
  std::vector<uint8_t> src = payload(n / 4, DType::F32, 9);
  std::memcpy(h.data(), src.data(), src.size());
  Buffer g(n, Mem::Workspace, gpu());
  copy_bytes(g.data(), gpu(), h.data(), Device::cpu(), src.size());
  CHECK(download(g.data(), src.size()) == src);
}

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device: skipping the CUDA tests\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
