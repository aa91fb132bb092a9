// Every op of the CUDA backend against its CPU twin (tests/cuda/op_harness.h): CPU fp32 is the
// reference, CUDA fp32 the candidate, with the harness's per-op fp32 tolerances; then every
// case twice on the GPU, bitwise equal. Where there is no GPU, main() exits 77 and ctest
// reports "skipped".
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"
#include "tests/cuda/op_harness.h"

using namespace swtest::harness;
using sw::Device;

namespace {

Backend cuda_backend() {
  return {"cuda-f32", &sw::ops_for(Device::cuda(sw::cuda_current_device())), sw::cuda_copy_to_device,
          sw::cuda_copy_to_host};
}

}  // namespace

TEST_CASE("cuda ops: every op matches the CPU fp32 twin") {
  const Backend ref = cpu_backend(sw::ops_for(Device::cpu()), "cpu-f32");
  const bool verbose = std::getenv("SW_TEST_VERBOSE") != nullptr;
  for (const Result& r : compare(ref, cuda_backend(), /*lowp=*/false, op_cases())) {
    if (verbose) std::printf("%s\n", r.str().c_str());
    INFO(r.str());
    CHECK(r.ok);
  }
}

TEST_CASE("cuda ops: the same inputs twice give bitwise-equal outputs") {
  const auto bad = determinism(cuda_backend(), op_cases());
  for (const auto& b : bad) INFO("differs between runs: " + b);
  CHECK(bad.empty());
}

TEST_CASE("cuda ops: fused residual norms equal the unfused pair bit for bit") {
  const auto bad = fused_norms_bitwise(cuda_backend());
  for (const auto& b : bad) INFO("fused != unfused: " + b);
  CHECK(bad.empty());
}

int main(int argc, char** argv) {
  if (sw::cuda_device_count() == 0) {
    std::printf("no CUDA device: skipping the CUDA op tests\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
