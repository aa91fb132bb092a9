// Shared by the engine tests: config parsing and its error messages, load_tokenizer's error
// messages, quiet train() options, metrics.jsonl and whole-file reading, and token files of
// random tokens.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "engine/config.h"
#include "engine/data.h"
#include "engine/tokenizer.h"
#include "engine/trainer.h"

namespace sw::enginetest {

// `text` parsed as the config file "cfg.json" with --set overrides `ov`.
inline TrainConfig parse(const std::string& text, const std::vector<std::string>& ov = {}) {
  return parse_config(text, "cfg.json", ov);
}

// The message of the error that parsing `text` raises, or "(no error)".
inline std::string error_of(const std::string& text, const std::vector<std::string>& ov = {}) {
  try {
    parse(text, ov);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The message of the error that load_tokenizer(path) raises, or "(no error)".
inline std::string error_of_load(const std::string& path) {
  try {
    load_tokenizer(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The directory `name` under the system's temporary directory, created if missing.
// <tmp>/<name>_<pid>: one per test process, so that tests run in parallel (ctest -j, or two
// checkouts testing at once) never write into each other's run directories (a shared
// metrics.jsonl got interleaved lines); removed when the process exits.
inline std::filesystem::path make_test_dir(const std::string& name) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  static std::vector<std::filesystem::path> made;
  if (made.empty())
    std::atexit([] {
      std::error_code ec;
      for (const auto& p : made) std::filesystem::remove_all(p, ec);
    });
  if (std::find(made.begin(), made.end(), d) == made.end()) made.push_back(d);
  std::filesystem::create_directories(d);
  return d;
}

// train() options without the progress line; the final weights exported or not.
inline TrainOptions quiet_options(bool export_weights) {
  TrainOptions o;
  o.progress = false;
  o.export_weights = export_weights;
  return o;
}

// Every line of `run_dir`/metrics.jsonl, parsed.
inline std::vector<nlohmann::json> read_metrics(const std::string& run_dir) {
  std::ifstream f(std::filesystem::path(run_dir) / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The whole file, byte for byte ("" when it cannot be opened).
inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Writes a token file of n tokens, token i = rng_bits(seed, 0, i) % vocab, at `path`; returns
// the path.
inline std::string write_random_tokens(const std::filesystem::path& path, size_t n, int vocab,
                                       uint64_t seed) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(rng_bits(seed, 0, i) % vocab);
  write_token_file(path.string(), t);
  return path.string();
}

}  // namespace sw::enginetest
