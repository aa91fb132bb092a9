// train() end to end on tiny GPT-2 models: determinism, learning, metrics, gradient
// accumulation, and the errors a user can cause.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/config.h"
#include "engine/data.h"
#include "engine/trainer.h"
#include "engine_test_util.h"
#include "models/model.h"

using namespace sw;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

fs::path test_dir() { return enginetest::make_test_dir("sw_test_trainer"); }

// Random tokens in [0, vocab): nothing to learn beyond frequencies.
std::string random_tokens(const std::string& name, size_t n, int vocab, uint64_t seed) {
  return enginetest::write_random_tokens(test_dir() / name, n, vocab, seed);
}

// A cycle 0, 1, ..., period-1, 0, 1, ...: the next token is a function of the current one.
std::string cycle_tokens(const std::string& name, size_t n, int period) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i % period);
  const std::string p = (test_dir() / name).string();
  write_token_file(p, t);
  return p;
}

TrainConfig tiny_config(const std::string& train, const std::string& run,
                        std::vector<std::string> extra = {}) {
  std::vector<std::string> ov = {"data.train=" + train, "run_dir=" + (test_dir() / run).string()};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return parse_config(R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2, "cos_min_ratio": 0.1}},
    "gradient_clipping": 1.0,
    "model": {"type": "gpt2", "vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16},
    "train_steps": 6, "seed": 1234, "eval_batches": 2, "threads": 2
  })",
                      "tiny.json", ov);
}

TrainOptions quiet(bool export_weights = false) {
  return enginetest::quiet_options(export_weights);
}

using enginetest::read_bytes;
using enginetest::read_metrics;

}  // namespace

TEST_CASE("train: two runs give bit-identical losses and grad norms and weights") {
  const std::string data = random_tokens("det.bin", 4000, 32, 1);
  const TrainConfig a = tiny_config(data, "det_a");
  const TrainConfig b = tiny_config(data, "det_b");
  const TrainSummary sa = train(a, quiet(true));
  const TrainSummary sb = train(b, quiet(true));
  const auto ma = read_metrics(a.run_dir), mb = read_metrics(b.run_dir);
  REQUIRE(ma.size() == 6);
  REQUIRE(mb.size() == 6);
  for (size_t i = 0; i < ma.size(); ++i) {
    CHECK(ma[i]["loss"].get<double>() == mb[i]["loss"].get<double>());  // exact
    CHECK(ma[i]["grad_norm"].get<double>() == mb[i]["grad_norm"].get<double>());
  }
  CHECK(sa.last_loss == sb.last_loss);
  REQUIRE(fs::exists(sa.weights_path));
  CHECK(read_bytes(sa.weights_path) == read_bytes(sb.weights_path));
  // A different seed changes the run.
  const TrainSummary sc = train(tiny_config(data, "det_c", {"seed=99"}), quiet());
  CHECK(sc.last_loss != sa.last_loss);
}

namespace {
// Trains `common` on the CPU and with device=sim; every step's loss and grad norm and the
// exported weights must be equal. Returns the sim run's summary.
TrainSummary same_on_sim(const std::string& data, const std::string& name,
                         const std::vector<std::string>& common) {
  std::vector<std::string> on_dev = common;
  on_dev.push_back("device=sim");
  const TrainConfig a = tiny_config(data, name + "_cpu", common);
  const TrainConfig b = tiny_config(data, name + "_sim", on_dev);
  CHECK(b.device == "sim");
  const TrainSummary sa = train(a, quiet(true));
  const TrainSummary sb = train(b, quiet(true));
  const auto ma = read_metrics(a.run_dir), mb = read_metrics(b.run_dir);
  REQUIRE(ma.size() == mb.size());
  for (size_t i = 0; i < ma.size(); ++i) {
    CHECK(ma[i]["loss"].get<double>() == mb[i]["loss"].get<double>());
    CHECK(ma[i]["grad_norm"].get<double>() == mb[i]["grad_norm"].get<double>());
  }
  CHECK(read_bytes(sa.weights_path) == read_bytes(sb.weights_path));
  return sb;
}
}  // namespace

TEST_CASE("train: a run on a device (the simulated accelerator) equals the CPU run bit for bit") {
  // tests/common/sim_device.h: device memory the host cannot touch; the CPU's arithmetic.
  const std::string data = random_tokens("dev.bin", 4000, 32, 1);
  for (const char* mp : {"fp32", "bf16"}) {
    INFO(mp);
    same_on_sim(data, std::string("dev_") + mp,
                {"mixed_precision.param_dtype=" + std::string(mp), "activation_checkpointing=full"});
  }
  // Offload from the config on the device: the host updater (moments and shards on the host),
  // NVMe files for moments, shards and activations; checkpoints saved asynchronously meanwhile.
  for (const char* off : {"cpu", "nvme"}) {
    INFO("offload " << off);
    const std::string o = off, dir = "dev_off_" + o;
    const std::string nv = (fs::path(SW_BINARY_DIR) / "test_tmp" / (dir + "_files")).string();
    fs::remove_all(nv);
    std::vector<std::string> common = {"zero_optimization.offload_optimizer.device=" + o,
                                       "zero_optimization.offload_param.device=" + o,
                                       "activation_checkpointing.offload=" + o,
                                       "checkpoint.every_steps=2", "checkpoint.async=true"};
    if (o == "nvme")
      for (const char* k : {"zero_optimization.offload_optimizer.nvme_path=",
                            "zero_optimization.offload_param.nvme_path=",
                            "activation_checkpointing.nvme_path="})
        common.push_back(k + nv);
    CHECK(same_on_sim(data, dir, common).checkpoints_saved > 0);
    fs::remove_all(nv);
  }
  CHECK_THROWS_WITH(train(tiny_config(data, "dev_bad", {"device=cuda:x"}), quiet()),
                    Catch::Contains("device"));
}

TEST_CASE("train: a learnable pattern drives the loss down and validation runs on schedule") {
  // Period 15 against seq_len 16: the training windows (at multiples of 16, engine/data.h)
  // start at every phase of the cycle, as the validation windows do.
  const std::string tr = cycle_tokens("cycle_train.bin", 3000, 15);
  const std::string va = cycle_tokens("cycle_val.bin", 500, 15);
  const TrainConfig c =
      tiny_config(tr, "learn",
                  {"data.val=" + va, "train_steps=40", "eval_every_steps=10",
                   "optimizer.params.lr=1e-2", "scheduler.params.warmup_num_steps=4"});
  const TrainSummary s = train(c, quiet());
  const auto m = read_metrics(c.run_dir);
  REQUIRE(m.size() == 40);
  const double first = m[0]["loss"].get<double>();
  CHECK(first == Approx(std::log(32.0)).epsilon(0.15));  // ~uniform over the vocabulary at init
  CHECK(s.last_loss < 0.1 * first);                      // the next token is deterministic
  CHECK(s.last_val_loss >= 0);
  CHECK(s.last_val_loss < 0.1 * first);
  CHECK(s.steps == 40);
  CHECK(s.unigram_entropy == Approx(std::log(15.0)).epsilon(1e-3));
  CHECK(s.tokens_per_s > 0);
  for (size_t i = 0; i < m.size(); ++i) {
    const int step = static_cast<int>(i) + 1;
    CHECK(m[i]["step"].get<int>() == step);
    CHECK(m[i].contains("val_loss") == (step % 10 == 0));
  }
}

TEST_CASE(
    "train: metrics.jsonl has the required keys and config.json re-loads and the summary matches") {
  const std::string data = random_tokens("keys.bin", 3000, 32, 2);
  const std::string val = random_tokens("keys_val.bin", 500, 32, 3);
  const TrainConfig c = tiny_config(data, "keys", {"data.val=" + val, "train_steps=3"});
  const TrainSummary s = train(c, quiet(true));
  const auto m = read_metrics(c.run_dir);
  REQUIRE(m.size() == 3);
  for (const auto& line : m) {
    for (const char* k :
         {"step", "loss", "lr", "grad_norm", "tokens_per_s", "peak_mem_bytes", "step_time_s"})
      CHECK(line.contains(k));
    // At least parameters, gradients and two AdamW moments, all fp32.
    CHECK(line["peak_mem_bytes"].get<size_t>() >=
          16 * static_cast<size_t>(build_model(c.model).num_params()));
    CHECK(line["grad_norm"].get<double>() > 0);
    // The read of the norm and losses is part of the step.
    REQUIRE(line.contains("norm_read_s"));
    CHECK(line["norm_read_s"].get<double>() >= 0);
    CHECK(line["norm_read_s"].get<double>() <= line["step_time_s"].get<double>());
  }
  CHECK(!m[0].contains("val_loss"));
  CHECK(m[2].contains("val_loss"));  // evaluated at the end
  CHECK(m[2]["val_loss"].get<double>() == s.last_val_loss);
  CHECK(m[2]["loss"].get<double>() == s.last_loss);
  // lr follows the schedule: warmup of 2 steps from 0.
  CHECK(m[0]["lr"].get<double>() == 0.0);
  CHECK(m[1]["lr"].get<double>() == Approx(1.5e-3));
  const TrainConfig back = load_config((fs::path(c.run_dir) / "config.json").string());
  CHECK(back.resolved_json == c.resolved_json);
  CHECK(s.weights_path == (fs::path(c.run_dir) / "hf").string());
  CHECK(fs::file_size(fs::path(s.weights_path) / "model.safetensors") > 0);
  CHECK(fs::file_size(fs::path(s.weights_path) / "config.json") > 0);
}

TEST_CASE("train: micro 4 x accum 1 and micro 2 x accum 2 train on the same global batch") {
  const std::string data = random_tokens("accum.bin", 4000, 32, 4);
  const TrainConfig one = tiny_config(data, "accum1", {"train_steps=3"});
  const TrainConfig two = tiny_config(
      data, "accum2",
      {"train_steps=3", "train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=2"});
  train(one, quiet());
  train(two, quiet());
  const auto a = read_metrics(one.run_dir), b = read_metrics(two.run_dir);
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    // Same windows, same mean: equal up to floating-point summation order.
    CHECK(b[i]["loss"].get<double>() == Approx(a[i]["loss"].get<double>()).epsilon(1e-5));
    CHECK(b[i]["grad_norm"].get<double>() == Approx(a[i]["grad_norm"].get<double>()).epsilon(1e-4));
  }
}

TEST_CASE("train: user mistakes stop the run with a message naming the key or file") {
  const std::string data = random_tokens("err.bin", 2000, 32, 5);
  // run_dir under a regular file cannot be created; checked before the data is even opened.
  const std::string blocker = (test_dir() / "a_file").string();
  std::ofstream(blocker) << "x";
  const std::string bad_dir = blocker + "/run";
  CHECK_THROWS_WITH(
      train(tiny_config((test_dir() / "no_such.bin").string(), "x", {"run_dir=" + bad_dir}),
            quiet()),
      Contains("train: run_dir '" + bad_dir + "': cannot create it"));
  // No training data configured.
  CHECK_THROWS_WITH(train(tiny_config("", "nodata"), quiet()),
                    Contains("tiny.json: data.train: required for training"));
  // Missing file.
  const std::string missing = (test_dir() / "missing.bin").string();
  CHECK_THROWS_WITH(train(tiny_config(missing, "missing"), quiet()),
                    Contains("data: " + missing + ": cannot open"));
  // Tokens outside the model's vocabulary.
  CHECK_THROWS_WITH(train(tiny_config(data, "vocab", {"model.vocab_size=16"}), quiet()),
                    Contains("data: " + data + ": token "));
  // A file too short for one window of seq_len + 1 tokens.
  const std::string shortf = random_tokens("short.bin", 10, 32, 6);
  CHECK_THROWS_WITH(train(tiny_config(shortf, "short"), quiet()),
                    Contains(shortf + ": 10 tokens, need at least 17"));
  // A TrainConfig built in code is validated like a file.
  TrainConfig code = tiny_config(data, "code");
  code.optimizer.lr = -1;
  code.resolved_json.clear();
  CHECK_THROWS_WITH(train(code, quiet()), Contains("optimizer.params.lr: must be > 0"));
}

TEST_CASE("train: a diverging run stops with a clear error and exports nothing") {
  const std::string data = random_tokens("nan.bin", 2000, 32, 7);
  const TrainConfig c =
      tiny_config(data, "nan",
                  {"optimizer.params.lr=1e30", "gradient_clipping=0", "scheduler.type=Constant",
                   "scheduler.params={}", "train_steps=20"});
  fs::remove_all(fs::path(c.run_dir) / "hf");
  CHECK_THROWS_WITH(train(c, quiet(true)), Contains("train: non-finite"));
  CHECK(!fs::exists(fs::path(c.run_dir) / "hf"));
  const auto m = read_metrics(c.run_dir);
  REQUIRE(!m.empty());
  CHECK(m.size() < 20);
}

TEST_CASE("train: memory_budget too small fails naming a category, a large enough one trains") {
  const std::string data = random_tokens("budget.bin", 4000, 32, 1);
  try {
    train(tiny_config(data, "budget_small", {"memory_budget=\"64KiB\""}), quiet());
    FAIL("no error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Matchers::Matches(
                        "memory: budget of 64\\.0 KiB exceeded: requesting [0-9.]+ [KMG]?i?B for "
                        "(params|grads|optimizer|activations|communication|workspace|checkpoint); "
                        "in use: params .*, checkpoint [0-9.]+ [KMG]?i?B"));
    CHECK(msg.find('\n') == std::string::npos);
  }
  CHECK(MemTracker::global().budget() == 0);  // lifted when the run ended
  const TrainSummary s = train(tiny_config(data, "budget_ok", {"memory_budget=1GiB"}), quiet());
  CHECK(s.steps == 6);
  CHECK(MemTracker::global().budget() == 0);
  // The same run without a budget computes the same losses.
  const TrainSummary s2 = train(tiny_config(data, "budget_none"), quiet());
  CHECK(s.last_loss == s2.last_loss);
  const auto m = read_metrics((test_dir() / "budget_ok").string());
  REQUIRE(m.size() == 6);
  CHECK(m[5].contains("minor_faults"));
  CHECK(m[5]["sys_s"].get<double>() >= 0);
}

TEST_CASE("train: offload_optimizer cpu fits a memory_budget that the same run without it exceeds") {
  const std::string data = random_tokens("offload.bin", 4000, 32, 2);
  const TrainSummary plain = train(tiny_config(data, "off_none"), quiet());
  const TrainSummary off = train(
      tiny_config(data, "off_cpu", {"zero_optimization.offload_optimizer.device=cpu"}), quiet());
  CHECK(off.last_loss == plain.last_loss);  // bit-identical: the moments only moved tier
  const auto peak = [](const char* run) {
    return read_metrics((test_dir() / run).string()).back()["peak_mem_bytes"].get<int64_t>();
  };
  const int64_t p_plain = peak("off_none"), p_off = peak("off_cpu");
  REQUIRE(p_off < p_plain);  // the device tier no longer holds AdamW's moments
  const std::string budget = "memory_budget=" + std::to_string((p_plain + p_off) / 2);
  CHECK_THROWS_WITH(train(tiny_config(data, "off_budget_none", {budget}), quiet()),
                    Contains("memory: budget of"));
  const TrainSummary fits = train(
      tiny_config(data, "off_budget_cpu",
                  {budget, "zero_optimization.offload_optimizer.device=cpu"}),
      quiet());
  CHECK(fits.last_loss == plain.last_loss);
}

TEST_CASE("train: offload_param cpu computes the same losses and takes the shards off the device") {
  const std::string data = random_tokens("offload_p.bin", 4000, 32, 4);
  const TrainSummary plain = train(tiny_config(data, "offp_none"), quiet());
  const TrainSummary off = train(
      tiny_config(data, "offp_cpu",
                  {"zero_optimization.offload_param.device=cpu",
                   "zero_optimization.offload_optimizer.device=cpu"}),
      quiet());
  CHECK(off.last_loss == plain.last_loss);
  const auto peak = [](const char* run) {
    return read_metrics((test_dir() / run).string()).back()["peak_mem_bytes"].get<int64_t>();
  };
  CHECK(peak("offp_cpu") < peak("offp_none"));
}

TEST_CASE("train: offload_optimizer nvme trains bit-identically, leaves no file, names a bad path") {
  const std::string data = random_tokens("offload_n.bin", 4000, 32, 5);
  const fs::path nvme = test_dir() / "nvme";
  fs::remove_all(nvme);
  const TrainSummary plain = train(tiny_config(data, "offn_none"), quiet());
  const TrainSummary off = train(
      tiny_config(data, "offn_nvme",
                  {"zero_optimization.offload_optimizer.device=nvme",
                   "zero_optimization.offload_optimizer.nvme_path=" + nvme.string(),
                   "zero_optimization.offload_optimizer.buffer_count=2"}),
      quiet());
  CHECK(off.last_loss == plain.last_loss);
  CHECK(fs::is_empty(nvme));  // the rank's file and directory are removed at a clean exit
  CHECK_THROWS_WITH(
      train(tiny_config(data, "offn_bad",
                        {"zero_optimization.offload_optimizer.device=nvme",
                         "zero_optimization.offload_optimizer.nvme_path=/proc/no_such_dir"}),
            quiet()),
      Contains("zero_optimization.offload_optimizer.nvme_path '/proc/no_such_dir': cannot create"));
}

// Issue 38: each optimizer type through train() (the resolved type reaches the model): the
// learnable cycle's loss falls.
TEST_CASE("train: SGD, LARS and Lamb drive the loss down") {
  const std::string tr = cycle_tokens("opt_cycle_train.bin", 3000, 15);
  const std::vector<std::pair<std::string, std::string>> opts = {
      {"sgd", R"(optimizer={"type": "SGD", "params": {"lr": 0.5, "momentum": 0.9, "nesterov": true}})"},
      {"lars", R"(optimizer={"type": "LARS", "params": {"lr": 2.0, "momentum": 0.9, "trust_coefficient": 0.02}})"},
      {"lamb", R"(optimizer={"type": "Lamb", "params": {"lr": 0.5, "weight_decay": 0.01}})"}};
  for (const auto& [name, ov] : opts) {
    INFO(name);
    const TrainConfig c = tiny_config(tr, "opt_" + name, {ov, "train_steps=40"});
    CHECK(c.optimizer.type != "AdamW");
    const TrainSummary s = train(c, quiet());
    const auto m = read_metrics(c.run_dir);
    REQUIRE(m.size() == 40);
    const double first = m[0]["loss"].get<double>();
    CHECK(s.last_loss < 0.5 * first);
  }
}
