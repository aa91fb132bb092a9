// Cross-checks our safetensors code against an independent Python implementation
// (tests/checkpoint/check_safetensors.py): Python verifies a file we wrote, then writes one by
// hand that we read. Runs with SW_PYTHON (Debian's python3, which also has torch).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>

#include "checkpoint/safetensors.h"
#include "core/dtype.h"
#include "st_test_util.h"

using namespace sw;

namespace {

int run_python(const std::string& args) {
  return sttest::run_python_script("check_safetensors.py", args);
}

}  // namespace

TEST_CASE("safetensors: Python reads what we write, we read what Python writes",
          "[safetensors][reference]") {
  sttest::TempDir dir("st_reference");
  // Must match expected() in check_safetensors.py.
  std::vector<float> f32(15), f16v(7), bfv(8);
  for (int i = 0; i < 15; ++i) f32[size_t(i)] = 0.25f * float(i) - 1.5f;
  std::vector<uint16_t> bf(8), hf(7);
  for (int i = 0; i < 8; ++i) bf[size_t(i)] = f32_to_bf16(0.5f * float(i) - 2.f);
  for (int i = 0; i < 7; ++i) hf[size_t(i)] = f32_to_f16(0.125f * float(i));
  std::vector<int32_t> ids(6);
  for (int i = 0; i < 6; ++i) ids[size_t(i)] = 7 * i - 3;
  const std::string ours = dir.file("ours.safetensors");
  save_safetensors(ours,
                   {{{"layer.f32", StDType::F32, {3, 5}}, f32.data()},
                    {{"layer.bf16", StDType::BF16, {2, 4}}, bf.data()},
                    {{"empty", StDType::F32, {0}}, nullptr},
                    {{"layer.f16", StDType::F16, {7}}, hf.data()},
                    {{"ids", StDType::I32, {2, 3}}, ids.data()}},
                   {{"format", "pt"}, {"writer", "shardwise-test"}});
  REQUIRE(run_python("verify " + ours) == 0);

  const std::string theirs = dir.file("theirs.safetensors");
  REQUIRE(run_python("write " + theirs) == 0);
  SafeTensorsReader r(theirs);
  CHECK(r.metadata().at("source") == "python");
  REQUIRE(r.tensors().size() == 3);
  CHECK(r.at("a").shape == Shape{3});
  CHECK(r.at("c").dtype == StDType::BF16);
  int32_t a[3];
  r.read_bytes("a", a);
  CHECK((a[0] == -1 && a[1] == 0 && a[2] == 2147483647));
  float b[4], c[2];
  r.read_f32("b", b);
  CHECK((b[0] == 1.5f && b[1] == -2.25f && b[2] == 1e-3f && b[3] == 6.0e4f));
  r.read_f32("c", c);
  CHECK((c[0] == 3.f && c[1] == -0.5f));
}
