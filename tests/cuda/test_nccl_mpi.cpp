// The NCCL device group against the MPI group on the same data, at 2 ranks (mpirun, one GPU
// per rank: local rank % GPUs). Exits 77 (ctest: skipped) before MPI starts when this machine
// has fewer than 2 GPUs. Tolerance: f32 results bitwise equal (at 2 ranks every reduction is
// one addition, or an exact halving for avg, in both); bf16 reductions within 1 bf16 ulp (both
// add in fp32 and round to bf16, but NCCL's rounding of avg is not documented), all-gather and
// broadcast bitwise. Never run yet: no machine with GPUs has run this file.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "core/launch.h"
#include "sharding/comm/nccl/nccl_group.h"
#include "tests/cuda/cuda_test_util.h"

using namespace sw;
using namespace sw::test;

TEST_CASE("nccl at 2 ranks: every collective equals the MPI group's on the same data") {
  GroupPtr world = mpi_world_group();
  REQUIRE(world->size() >= 2);
  GroupPtr nccl = make_nccl_group(*world, gpu());
  REQUIRE(nccl != nullptr);
  CHECK(nccl->rank() == world->rank());
  CHECK(nccl->size() == world->size());
  const int64_t count = 3001;
  const uint32_t r = static_cast<uint32_t>(world->rank());
  for (const Case& c : all_cases(world->size())) {
    INFO(c.name() << " rank " << r);
    const size_t elems =
        static_cast<size_t>(count) * (c.kind == CollKind::ReduceScatter ? world->size() : 1);
    const std::vector<uint8_t> in = payload(elems, c.dt, 100u + 17u * r);
    Work w;
    const auto got = run_case(*nccl, c, in, count, true, &w);
    const auto want = run_case(*world, c, in, count, false);
    CHECK(w.native_handle() != nullptr);
    const bool reduction = c.kind == CollKind::ReduceScatter || c.kind == CollKind::AllReduce;
    CHECK(max_ulps(got, want, c.dt) <= (reduction && c.dt == DType::BF16 ? 1 : 0));
  }
  nccl->barrier();
}

TEST_CASE("nccl at 2 ranks: split by rank gives one-rank NCCL groups") {
  GroupPtr world = mpi_world_group();
  GroupPtr nccl = make_nccl_group(*world, gpu());
  REQUIRE(nccl != nullptr);
  GroupPtr solo = nccl->split(world->rank(), 0);
  REQUIRE(solo != nullptr);
  CHECK(solo->size() == 1);
  std::vector<uint8_t> h = payload(100, DType::F32, 5u + static_cast<uint32_t>(world->rank()));
  Buffer d = upload(h);
  solo->all_reduce(d.data(), d.data(), 100, ReduceOp::Sum);
  CHECK(download(d.data(), 400) == h);
  GroupPtr none = nccl->split(world->rank() == 0 ? 0 : -1, 0);
  CHECK((none != nullptr) == (world->rank() == 0));
}

int main(int argc, char** argv) {
  if (cuda_device_count() < 2) {
    std::printf("fewer than 2 CUDA devices: skipping the 2-rank NCCL tests\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
