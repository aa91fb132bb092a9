// Shared by the mixed-precision training tests: generated English-like text, the default
// model's shape as a config, metrics reading.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "engine/config.h"
#include "engine/data.h"
#include "engine/trainer.h"
#include "engine_test_util.h"

namespace sw::mptest {

namespace fs = std::filesystem;
using enginetest::read_bytes;
using enginetest::read_metrics;

inline fs::path test_dir() { return enginetest::make_test_dir("sw_test_mixed_precision"); }

// Sentences of words drawn from a small lexicon with skewed frequencies: bytes with
// structure a small model learns quickly (spelling, spaces, capitals after full stops).
inline const std::string& text_data() {
  static const std::string path = [] {
    static const char* words[] = {"the", "of", "and", "a", "to", "in", "is", "you", "that",
                                  "it", "he", "was", "for", "on", "are", "as", "with", "his",
                                  "they", "at", "be", "this", "have", "from", "or", "one",
                                  "had", "by", "word", "but", "not", "what", "all", "were",
                                  "we", "when", "your", "can", "said", "there", "use", "an",
                                  "each", "which", "she", "do", "how", "their", "if", "will"};
    const int n = sizeof(words) / sizeof(words[0]);
    std::vector<uint16_t> t;
    bool cap = true;
    for (uint64_t i = 0; t.size() < 120000; ++i) {
      const uint64_t r = rng_bits(5, 0, i);
      const int w = static_cast<int>((r % n) * ((r >> 20) % n) / n);  // skewed to the front
      std::string s = words[w];
      if (cap) s[0] = static_cast<char>(s[0] - 32);
      cap = (r >> 40) % 9 == 0;
      s += cap ? ". " : " ";
      for (char ch : s) t.push_back(static_cast<uint8_t>(ch));
    }
    const std::string p = (test_dir() / "words.bin").string();
    write_token_file(p, t);
    return p;
  }();
  return path;
}

// The default model's shape (configs/default.json) with seq_len 64 and micro-batch 4; `extra`
// are --set overrides.
inline TrainConfig config(const std::string& run, std::vector<std::string> extra = {}) {
  std::vector<std::string> ov = {"data.train=" + text_data(),
                                 "run_dir=" + (test_dir() / run).string()};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return parse_config(R"({
    "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 4, "n_head": 4, "d_model": 128,
              "seq_len": 64},
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                  "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 20,
                  "cos_min_ratio": 0.1}},
    "gradient_clipping": 1.0, "train_steps": 200, "seed": 1337, "threads": 1
  })",
                      "mp.json", ov);
}

inline TrainOptions quiet(bool export_weights = false) {
  return enginetest::quiet_options(export_weights);
}

inline std::vector<double> losses(const std::vector<nlohmann::json>& m) {
  std::vector<double> l;
  for (const auto& x : m) l.push_back(x["loss"].is_null() ? NAN : x["loss"].get<double>());
  return l;
}

// Mean of losses[a, b).
inline double mean(const std::vector<double>& l, size_t a, size_t b) {
  double s = 0;
  for (size_t i = a; i < b; ++i) s += l[i];
  return s / static_cast<double>(b - a);
}

}  // namespace sw::mptest
