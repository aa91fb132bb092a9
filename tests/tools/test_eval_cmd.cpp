// `shardwise eval`: the loss over whole token files (16- and 32-bit ids, several files, a
// mask) equals the same model's losses summed window by window in this process, one window at
// a time (another batching, no padding of the last window); perplexity is exp(loss); the
// errors are one line. (Against PyTorch: test_eval_reference.cpp.)
#include <catch2/catch.hpp>
#include <cmath>

#include "checkpoint/export.h"
#include "engine/config.h"
#include "eval_test_util.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"

using namespace sw;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
// Sum of losses and count over the targets of `path` in windows of T, each its own batch of
// one row of its natural length.
std::pair<double, long long> by_window(ShardedModel& sm, const std::string& path, int T) {
  const TokenFile f(path, 1 << 20, 2);
  double sum = 0;
  long long n = 0;
  for (int64_t s = 0; s < f.size() - 1; s += T) {
    const int len = static_cast<int>(std::min<int64_t>(T, f.size() - 1 - s));
    std::vector<int32_t> in(len), tg(len);
    f.copy(s, len, in.data());
    f.copy(s + 1, len, tg.data());
    long long k = 0;
    for (int t = 0; t < len; ++t) {
      if (f.mask() && !f.mask()[s + 1 + t]) tg[t] = -1;
      k += tg[t] >= 0;
    }
    if (!k) continue;
    Batch b;
    b.B = 1, b.T = len, b.tokens = in.data(), b.targets = tg.data();
    sum += sm.eval_loss(b) * static_cast<double>(k);
    n += k;
  }
  return {sum, n};
}
}  // namespace

TEST_CASE("eval: the loss over whole files equals a window-by-window sum, masks excluded") {
  const fs::path d = evaltest::trained_dir("cmd");
  // Held-out data: 16-bit ids in a.bin (1001 tokens: a short last window), 32-bit ids and a
  // mask in b.bin (all ids < 40, written as version 2).
  const fs::path v = d / "val";
  fs::create_directories(v);
  std::vector<uint16_t> a(1001);
  std::vector<int32_t> b(517);
  std::vector<uint8_t> m(517);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i % 13);
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<int32_t>(rng_bits(9, 0, i) % 40);
    m[i] = (i / 20) % 2;
  }
  write_token_file((v / "a.bin").string(), a);
  write_token_file((v / "b.bin").string(), b, 100000);
  write_mask_file((v / "b.mask").string(), m);
  REQUIRE(TokenFile((v / "b.bin").string(), 40, 2).width() == 4);

  const TrainConfig cfg = load_config((d / "cfg.json").string(), {});
  Model model = build_model(cfg.model);
  ShardedModel sm(model, ops_for(Device::cpu()), 123);
  import_safetensors(sm, (d / "run" / "hf").string());

  long long total_n = 0;
  double total = 0;
  for (const char* f : {"a.bin", "b.bin"}) {
    const clitest::Result r = clitest::sw_run(
        d, {"eval", "cfg.json", "--weights", "run/hf", "--data", (v / f).string()}, 1);
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    const evaltest::EvalLine e = evaltest::parse(r.out);
    const auto [sum, n] = by_window(sm, (v / f).string(), 16);
    CHECK(e.tokens == n);
    CHECK(e.loss == Approx(sum / n).epsilon(1e-5));
    CHECK(e.ppl == Approx(std::exp(e.loss)).epsilon(1e-5));
    total += sum, total_n += n;
  }
  CHECK(total_n == 1000 + 257);  // every target of a.bin; the targets 1..516 of b.bin with mask 1
  // The directory: both files, one mean over all counted targets; --batch changes nothing.
  for (const char* batch : {"1", "7"}) {
    const clitest::Result r = clitest::sw_run(
        d, {"eval", "cfg.json", "--weights", "run/hf", "--data", v.string(), "--batch", batch},
        1);
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, Contains("(2 files,"));
    const evaltest::EvalLine e = evaltest::parse(r.out);
    CHECK(e.tokens == total_n);
    CHECK(e.loss == Approx(total / total_n).epsilon(1e-5));
  }
  fs::remove_all(d);
}

TEST_CASE("eval: bad weights, a token id beyond the vocabulary: one line, exit 1") {
  const fs::path d = evaltest::trained_dir("err");
  clitest::Result r =
      clitest::sw_run(d, {"eval", "cfg.json", "--weights", "nope", "--data", "train.bin"}, 1);
  CHECK(r.rc == 1);
  CHECK(r.err == "shardwise: error: eval: weights 'nope' not found\n");
  write_token_file((d / "big.bin").string(), std::vector<int32_t>{1, 2, 70000, 3}, 100000);
  r = clitest::sw_run(d, {"eval", "cfg.json", "--weights", "run/hf", "--data", "big.bin"}, 1);
  CHECK(r.rc == 1);
  CHECK(r.err ==
        "shardwise: error: data: big.bin: token 70000 at position 2 is >= model.vocab_size 40\n");
  fs::remove_all(d);
}

TEST_CASE("eval and sample: a Hugging Face directory's config.json is the model block") {
  const fs::path d = evaltest::trained_dir("hfdir");
  // The same run's data without a model block: the weights' config.json supplies it.
  clitest::spit(d / "bare.json", R"({"data": {"train": "train.bin"}, "run_dir": "run",
                                       "checkpoint": {"resume": "auto"}})");
  const clitest::Result full = clitest::sw_run(
      d, {"eval", "cfg.json", "--weights", "run/hf", "--data", "train.bin"}, 1);
  const clitest::Result bare = clitest::sw_run(
      d, {"eval", "bare.json", "--weights", "run/hf", "--data", "train.bin"}, 1);
  INFO(full.err << bare.err);
  REQUIRE(full.rc == 0);
  REQUIRE(bare.rc == 0);
  CHECK(bare.out == full.out);  // the same model, weights and windows: the same line
  const std::vector<std::string> greedy = {"--prompt", "!#$", "--tokens", "8", "--temperature",
                                           "0"};
  std::vector<std::string> s_full = {"sample", "--config", "cfg.json"},
                           s_bare = {"sample", "--config", "bare.json"};
  s_full.insert(s_full.end(), greedy.begin(), greedy.end());
  s_bare.insert(s_bare.end(), greedy.begin(), greedy.end());
  const clitest::Result a = clitest::sw_run(d, s_full, 1), b = clitest::sw_run(d, s_bare, 1);
  INFO(a.err << b.err);
  REQUIRE(a.rc == 0);
  REQUIRE(b.rc == 0);
  CHECK(b.out == a.out);
  // A model key the weights cannot hold: one line naming it.
  const clitest::Result bad =
      clitest::sw_run(d, {"eval", "bare.json", "--weights", "run/hf", "--data", "train.bin",
                          "--set", "model.n_layer=3"},
                      1);
  CHECK(bad.rc == 1);
  CHECK_THAT(bad.err, Contains("model.n_layer") && Contains("config.json"));
  fs::remove_all(d);
}
