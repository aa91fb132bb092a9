#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/launch.h"
#include "core/rng.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "core/worker.h"

using namespace sw;

TEST_CASE("MemTracker counts current and peak bytes per category and in total") {
  auto& t = MemTracker::global();
  const size_t p0 = t.current(Mem::Params), a0 = t.current(Mem::Activations);
  const size_t tot0 = t.total_current();
  t.reset_peaks();
  {
    Buffer a(1000, Mem::Params);
    Buffer b(500, Mem::Activations);
    CHECK(t.current(Mem::Params) == p0 + 1000);
    CHECK(t.current(Mem::Activations) == a0 + 500);
    CHECK(t.total_current() == tot0 + 1500);
    b.release();
    Buffer c(200, Mem::Activations);
    CHECK(t.total_peak() == tot0 + 1500);  // peak of the sum, not the sum of peaks
    CHECK(t.peak(Mem::Activations) == a0 + 500);
  }
  CHECK(t.current(Mem::Params) == p0);
  CHECK(t.total_current() == tot0);
  CHECK(reinterpret_cast<uintptr_t>(Buffer(3, Mem::Workspace).data()) % 64 == 0);
}

TEST_CASE("Buffer moves transfer ownership exactly once") {
  auto& t = MemTracker::global();
  const size_t before = t.current(Mem::Grads);
  Buffer a(256, Mem::Grads);
  Buffer b = std::move(a);
  CHECK(a.empty());
  CHECK(b.bytes() == 256);
  b = Buffer(64, Mem::Grads);
  CHECK(t.current(Mem::Grads) == before + 64);
}

TEST_CASE("bf16 and f16 conversions round to nearest even and keep specials") {
  for (float f : {0.f, 1.f, -2.5f, 3.14159f, 1e-3f, 65504.f, 1e30f}) {
    CHECK(std::fabs(bf16_to_f32(f32_to_bf16(f)) - f) <= std::fabs(f) * (1.f / 256));
  }
  for (float f : {0.f, 1.f, -2.5f, 3.14159f, 1e-3f, 65504.f, 6e-8f}) {
    CHECK(std::fabs(f16_to_f32(f32_to_f16(f)) - f) <= std::fabs(f) * (1.f / 1024) + 6e-8f);
  }
  // Exactly representable values survive round trips bit for bit, every f16 pattern included.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    const float f = f16_to_f32(x);
    if (std::isnan(f)) continue;
    REQUIRE(f32_to_f16(f) == x);
  }
  CHECK(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(f32_to_bf16(1.00390625f) == 0x3f80);  // tie rounds to even
}

TEST_CASE("dtype names parse and bad names name the value") {
  CHECK(dtype_from_name("bfloat16") == DType::BF16);
  CHECK(dtype_from_name("fp16") == DType::F16);
  CHECK_THROWS_WITH(dtype_from_name("int8"), Catch::Contains("'int8'"));
}

TEST_CASE("counter-based normals depend only on (seed, stream, index)") {
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = rng_normal(7, 3, i);
    s += x;
    s2 += x * x;
  }
  CHECK(std::fabs(s / n) < 0.01);
  CHECK(std::fabs(s2 / n - 1.0) < 0.02);
  CHECK(rng_normal(7, 3, 12345) == rng_normal(7, 3, 12345));
  CHECK(rng_normal(7, 3, 12345) != rng_normal(8, 3, 12345));
}

TEST_CASE("Tensor allocates shape x dtype bytes") {
  Tensor t({3, 5}, DType::BF16, Mem::Params);
  CHECK(t.numel() == 15);
  CHECK(t.bytes() == 30);
  CHECK(shape_str(t.shape()) == "(3, 5)");
  CHECK(t.dim(-1) == 5);
}

TEST_CASE("launch: one precedence for the launcher's variables") {
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_SIZE", "PMI_RANK", "PMIX_RANK",
                        "MPI_LOCALNRANKS", "MPI_LOCALRANKID", "SLURM_STEP_NUM_TASKS",
                        "SLURM_PROCID", "SLURM_NTASKS_PER_NODE", "SLURM_LOCALID"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars)
    if (const char* x = std::getenv(v)) saved.emplace_back(v, x);
  for (const char* v : vars) unsetenv(v);

  sw::LaunchEnv e = sw::launch_env();
  CHECK(e.world_size == 1);
  CHECK(e.rank == 0);
  CHECK(e.local_size == 0);  // unknown
  CHECK(e.local_rank == 0);

  // Slurm alone.
  setenv("SLURM_STEP_NUM_TASKS", "8", 1);
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS_PER_NODE", "4", 1);
  setenv("SLURM_LOCALID", "1", 1);
  e = sw::launch_env();
  CHECK(e.world_size == 8);
  CHECK(e.rank == 5);
  CHECK(e.local_size == 4);
  CHECK(e.local_rank == 1);
  // mpirun (OpenMPI) inside the allocation wins; an unusable value falls through.
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "0", 1);  // not >= 1: MPI_LOCALNRANKS, then Slurm
  setenv("MPI_LOCALNRANKS", "3", 1);
  e = sw::launch_env();
  CHECK(e.world_size == 2);
  CHECK(e.rank == 1);
  CHECK(e.local_size == 3);
  // MPICH's PMI comes before Slurm, after OpenMPI.
  unsetenv("OMPI_COMM_WORLD_SIZE");
  setenv("PMI_SIZE", "6", 1);
  CHECK(sw::launch_env().world_size == 6);

  for (const char* v : vars) unsetenv(v);
  for (const auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
}

TEST_CASE("HostWorker runs jobs in order, carries failures to their events, holds and drains") {
  std::vector<int> order;
  std::shared_ptr<sw::Event> last, bad;
  std::atomic<int> ran{0};
  {
    sw::HostWorker w;
    w.hold(true);
    for (int i = 0; i < 5; ++i) last = w.post([&order, i] { order.push_back(i); });
    bad = w.post([] { throw sw::Error("host job: out of luck"); });
    CHECK(w.pending() == 6);
    CHECK_FALSE(last->query());  // held: nothing ran
    CHECK(order.empty());
    w.hold(false);
    last->synchronize();
    CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
    CHECK_THROWS_WITH(bad->synchronize(), "host job: out of luck");
    w.drain();
    CHECK(w.pending() == 0);
    w.hold(true);
    for (int i = 0; i < 3; ++i) w.post([&ran] { ++ran; });
  }  // the destructor releases and runs what was posted before joining
  CHECK(ran == 3);
  CHECK(sw::completed_event()->query());
}

TEST_CASE("timed host events: elapsed_since between stamps, and an untimed event throws, not aborts") {
  // (issue 39: CudaEvent::elapsed_since aborted on a mismatched event where Event promises a
  // thrown sw::Error; the host stream's StampedEvent has the same contract.)
  sw::HostStream& s = sw::host_stream();
  const std::shared_ptr<sw::Event> a = s.record_timed();
  const std::shared_ptr<sw::Event> b = s.record_timed();
  CHECK(b->elapsed_since(*a) >= 0);
  CHECK(a->elapsed_since(*b) <= 0);
  CHECK_THROWS_AS(b->elapsed_since(*s.record()), sw::Error);
  CHECK_THROWS_AS(s.record()->elapsed_since(*a), sw::Error);
}
