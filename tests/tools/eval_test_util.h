// Shared by test_eval_cmd.cpp and test_eval_reference.cpp: a tiny trained GPT-2 (weights from
// `shardwise train`), token files with and without masks, and `shardwise eval`'s line parsed.
#pragma once
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/rng.h"
#include "engine/data.h"
#include "tests/common/cli_run.h"

namespace evaltest {

namespace fs = std::filesystem;

// A fresh directory with cfg.json (gpt2, vocab 40, seq_len 16), train.bin, and the weights
// of 30 training steps in run/hf.
inline fs::path trained_dir(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / ("sw_test_eval_" + tag + "_" +
                                                  std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::vector<uint16_t> t(3000);
  for (size_t i = 0; i < t.size(); ++i)  // a noisy cycle: something to learn
    t[i] = static_cast<uint16_t>(sw::rng_bits(5, 0, i) % 4 == 0 ? sw::rng_bits(6, 0, i) % 40
                                                                : i % 13);
  sw::write_token_file((d / "train.bin").string(), t);
  clitest::spit(d / "cfg.json", R"({
    "model": {"type": "gpt2", "vocab_size": 40, "n_layer": 2, "n_head": 2, "d_model": 32,
              "seq_len": 16},
    "data": {"train": "train.bin"}, "run_dir": "run",
    "train_micro_batch_size_per_gpu": 4, "train_steps": 30, "threads": 1, "seed": 3,
    "optimizer": {"params": {"lr": 0.01}}
  })");
  const clitest::Result r = clitest::sw_run(d, {"train", "cfg.json", "--quiet"}, 1);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  return d;
}

struct EvalLine {
  double loss = -1, ppl = -1;
  long long tokens = -1;
};

// "loss L perplexity P tokens N (...)"
inline EvalLine parse(const std::string& out) {
  EvalLine e;
  REQUIRE(std::sscanf(out.c_str(), "loss %lf perplexity %lf tokens %lld", &e.loss, &e.ppl,
                      &e.tokens) == 3);
  return e;
}

}  // namespace evaltest
