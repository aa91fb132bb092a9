// Shared by the tests launched through mpirun (tests/sharding, tests/checkpoint) and their
// one-rank companions: the world group, tiny GPT-2 / Llama configurations, a synthetic corpus
// and a cross-rank sum.
#pragma once
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/comm/group.h"

namespace swtest {

inline const sw::Ops& cpu() { return sw::ops_for(sw::Device::cpu()); }

// The world group, made once per process; each rank then runs one OpenMP thread (ranks
// oversubscribe the cores).
inline sw::GroupPtr world() {
  static sw::GroupPtr g = [] {
    sw::GroupPtr w = sw::world_group();
    sw::set_num_threads(1);
    return w;
  }();
  return g;
}

// A directory for this job's files (NVMe offload): made by rank 0, its name broadcast (jobs of
// other world sizes may run at the same time).
inline std::string job_tmp_dir(const sw::GroupPtr& g, const char* prefix = "sw_offload") {
  char name[256] = {};
  if (g->rank() == 0) {
    std::string t = (std::filesystem::temp_directory_path() / (std::string(prefix) + "_XXXXXX")).string();
    if (mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp " + t + " failed");
    std::snprintf(name, sizeof name, "%s", t.c_str());
  }
  g->broadcast(name, sizeof name / 4, 0);
  return name;
}

// A tiny model of `type` ("gpt2" or "llama"): vocabulary 64, width 32, 16 positions.
inline sw::ModelConfig tiny_config(const std::string& type, int n_layer = 2) {
  sw::ModelConfig c;
  c.type = type;
  c.vocab_size = 64;
  c.n_layer = n_layer;
  c.d_model = 32;
  c.seq_len = 16;
  if (type == "gpt2") {
    c.n_head = 2;
  } else {
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_ff = 64;
  }
  return c;
}

// Synthetic "text": a fixed token sequence with structure (a noisy counter), and windows
// chosen by (step, global row) only, like engine/data.h.
struct Corpus {
  std::vector<int32_t> toks;
  explicit Corpus(int V) {
    sw::Rng r(99);
    int32_t t = 0;
    for (int i = 0; i < 4096; ++i) {
      t = (t + 1 + (r.below(7) == 0 ? static_cast<int32_t>(r.below(5)) : 0)) % V;
      toks.push_back(t);
    }
  }
  // Rows first_row .. first_row + B - 1 of step `step`.
  void fill(int step, int64_t first_row, int B, int T, int32_t* in, int32_t* tg) const {
    const uint64_t n = toks.size() - static_cast<uint64_t>(T) - 1;
    for (int b = 0; b < B; ++b) {
      const uint64_t start =
          sw::rng_bits(7, static_cast<uint64_t>(step), static_cast<uint64_t>(first_row + b)) % n;
      for (int t = 0; t < T; ++t) {
        in[size_t(b) * T + t] = toks[start + t];
        tg[size_t(b) * T + t] = toks[start + t + 1];
      }
    }
  }
};

// The sum of one double per rank over g (exact bits travel: a double is gathered as two floats).
inline double sum_doubles(sw::Group& g, double x) {
  std::vector<double> all(static_cast<size_t>(g.size()));
  g.all_gather(&x, all.data(), 2, sw::DType::F32);
  double s = 0;
  for (double v : all) s += v;
  return s;
}

}  // namespace swtest
