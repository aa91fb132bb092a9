// Loss masks in training: the step loss is the mean over the counted targets of the whole
// global batch, whatever the split into micro-steps (a per-micro-step mean would weigh the
// micro-steps' tokens differently and fail here); its value against a hand computation from
// per-token losses; an all-ones mask trains as no mask does. (The masked mean against
// PyTorch: tests/tools/test_eval_reference.cpp.)
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <set>

#include "core/rng.h"
#include "engine/config.h"
#include "engine/data.h"
#include "engine/trainer.h"
#include "engine_test_util.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"

using namespace sw;
namespace fs = std::filesystem;

namespace {
fs::path test_dir() { return enginetest::make_test_dir("sw_test_mask_train"); }

// Random tokens over 32 ids and a mask that keeps long runs in some places and few tokens in
// others, so micro-batches count very different numbers of targets.
std::string masked_data(const std::string& name, bool all_ones = false) {
  const fs::path d = test_dir() / name;
  fs::create_directories(d);
  const int n = 3000;
  std::vector<int32_t> t(n);
  std::vector<uint8_t> m(n);
  for (int i = 0; i < n; ++i) {
    t[i] = static_cast<int32_t>(rng_bits(21, 0, i) % 32);
    const bool dense = (i / 40) % 3 == 0;
    m[i] = all_ones || (dense ? rng_bits(22, 0, i) % 10 != 0 : rng_bits(22, 0, i) % 10 == 0);
  }
  write_token_file((d / "train.bin").string(), t, 32);
  write_mask_file((d / "train.mask").string(), m);
  return (d / "train.bin").string();
}

TrainConfig config(const std::string& train, const std::string& run, int micro, int accum,
                   std::vector<std::string> extra = {}) {
  std::vector<std::string> ov = {"data.train=" + train, "run_dir=" + (test_dir() / run).string(),
                                 "train_micro_batch_size_per_gpu=" + std::to_string(micro),
                                 "gradient_accumulation_steps=" + std::to_string(accum)};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return parse_config(R"({
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 1}},
    "gradient_clipping": 1.0,
    "model": {"type": "gpt2", "vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16},
    "train_steps": 4, "seed": 77, "threads": 2
  })",
                      "mask.json", ov);
}

std::vector<double> losses(const TrainConfig& c) {
  train(c, enginetest::quiet_options(false));
  std::vector<double> out;
  for (const auto& j : enginetest::read_metrics(c.run_dir)) out.push_back(j["loss"].get<double>());
  return out;
}
}  // namespace

TEST_CASE("mask train: the loss is the mean over the global batch's counted targets, any split") {
  const std::string data = masked_data("split");
  const std::vector<double> one = losses(config(data, "m8x1", 8, 1));
  const std::vector<double> two = losses(config(data, "m2x4", 2, 4));
  const std::vector<double> odd = losses(config(data, "m4x2", 4, 2));
  REQUIRE(one.size() == 4);
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(two[i] == Approx(one[i]).epsilon(1e-5));
    CHECK(odd[i] == Approx(one[i]).epsilon(1e-5));
  }
  // The micro-batches of step 1 count different numbers of targets (else the test could not
  // tell a global mean from a mean of per-micro-step means).
  const Corpus c(data, 32, 16);
  std::set<int64_t> counts;
  for (int k = 0; k < 4; ++k) counts.insert(train_counted(c, 77, 0, 8, 2 * k, 2));
  CHECK(counts.size() > 1);
}

TEST_CASE("mask train: step 1's loss equals the mean of per-token losses over the kept targets") {
  const std::string data = masked_data("byhand");
  const TrainConfig cfg = config(data, "byhand", 2, 4, {"train_steps=1"});
  const double loss = losses(cfg)[0];
  // The same initial weights (the seed's), each target's loss alone: a batch that counts
  // one target. The step's 8 rows of 16 tokens, as the trainer drew them.
  Model m = build_model(cfg.model);
  ShardedModel sm(m, ops_for(Device::cpu()), cfg.seed);
  const Corpus c(data, 32, 16);
  const int R = 8, T = 16;
  std::vector<int32_t> in(R * T), tg(R * T), one(T);
  const int64_t kept = train_batch(c, cfg.seed, 0, R, 0, R, T, in.data(), tg.data());
  // Per row: the sum and count of its kept targets' losses, each target alone.
  std::vector<double> row_sum(R, 0);
  std::vector<int64_t> row_n(R, 0);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      if (tg[r * T + t] < 0) continue;
      std::fill(one.begin(), one.end(), -1);
      one[t] = tg[r * T + t];
      Batch b;
      b.B = 1, b.T = T, b.tokens = in.data() + r * T, b.targets = one.data();
      row_sum[r] += sm.eval_loss(b);
      ++row_n[r];
    }
  double sum = 0;
  int64_t n = 0;
  for (int r = 0; r < R; ++r) sum += row_sum[r], n += row_n[r];
  REQUIRE(n == kept);
  CHECK(loss == Approx(sum / static_cast<double>(n)).epsilon(1e-6));
  // A mean of the micro-steps' means (2 rows each) differs from it by far more than the
  // tolerance.
  double mom = 0;
  for (int k = 0; k < 4; ++k) {
    const double s = row_sum[2 * k] + row_sum[2 * k + 1];
    const int64_t cnt = row_n[2 * k] + row_n[2 * k + 1];
    mom += cnt ? s / static_cast<double>(cnt) / 4 : 0;
  }
  CHECK(std::abs(mom - loss) > 1e-4 * loss);
}

TEST_CASE("mask train: an all-ones mask trains as no mask does") {
  const std::string data = masked_data("ones", true);
  const std::vector<double> with = losses(config(data, "ones_mask", 2, 4));
  fs::remove(test_dir() / "ones" / "train.mask");
  const std::vector<double> without = losses(config(data, "ones_nomask", 2, 4));
  REQUIRE(with.size() == 4);
  for (size_t i = 0; i < with.size(); ++i) CHECK(with[i] == Approx(without[i]).epsilon(1e-9));
}

TEST_CASE("mask train: on a device (the simulated accelerator) a masked run equals the CPU's") {
  // The counted targets of a batch on the device come from the host's copy (BatchUpload).
  const std::string data = masked_data("sim");
  const TrainConfig a = config(data, "sim_cpu", 2, 4);
  const TrainConfig b = config(data, "sim_dev", 2, 4, {"device=sim"});
  REQUIRE(b.device == "sim");
  const std::vector<double> la = losses(a), lb = losses(b);
  REQUIRE(la.size() == 4);
  CHECK(la == lb);  // bit for bit
}
