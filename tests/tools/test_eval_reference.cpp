// `shardwise eval` against PyTorch (tests/tools/eval_reference.py, float64, the GPT-2 of
// tests/checkpoint/gpt2_reference.py): one masked file of 32-bit ids and the training file
// itself; the loss within 1e-4 relative and the same count of tokens.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "eval_test_util.h"

using namespace sw;
namespace fs = std::filesystem;

TEST_CASE("eval reference: shardwise eval's loss equals PyTorch's over whole files",
          "[reference]") {
  const fs::path d = evaltest::trained_dir("ref");
  std::vector<int32_t> b(701);
  std::vector<uint8_t> m(701);
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<int32_t>(i % 13);
    m[i] = rng_bits(8, 0, i) % 3 != 0;
  }
  write_token_file((d / "held.bin").string(), b, 70000);  // version 2
  write_mask_file((d / "held.mask").string(), m);
  for (const char* f : {"train.bin", "held.bin"}) {
    const clitest::Result r = clitest::sw_run(
        d, {"eval", "cfg.json", "--weights", "run/hf", "--data", f}, 1);
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    const evaltest::EvalLine e = evaltest::parse(r.out);
    char loss[64];
    std::snprintf(loss, sizeof loss, "%.12f", e.loss);
    const std::string cmd = std::string(SW_PYTHON) + " " + SW_SOURCE_DIR +
                            "/tests/tools/eval_reference.py " +
                            (d / "run" / "hf" / "model.safetensors").string() + " " +
                            (d / f).string() + " 16 2 2 32 1e-5 " + loss + " " +
                            std::to_string(e.tokens);
    INFO(cmd);
    const int rc = std::system(cmd.c_str());
    CHECK((WIFEXITED(rc) && WEXITSTATUS(rc) == 0));
  }
  fs::remove_all(d);
}
