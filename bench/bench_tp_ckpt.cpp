// Checkpoints of a tensor-parallel model (issue 36) against the same model untensored, on the
// same ranks: run as `mpirun -np 2 bench_tp_ckpt [DIR] [--small] [--reps N]`.
//
// GPT-2 124M shape (12 layers, d 768, 12 heads, T 1024) with the vocabulary padded to 50304 (a
// tensor degree must divide it; 50257 is odd): fp32 master + AdamW m, v, about 1.5 GB in all.
//   t1   the world as FULL_SHARD (format v1: each rank's range of each unit's flat buffer)
//   t2   tensor 2 (format v2: blocks of logical parameters, rows x columns)
// For each: save_checkpoint (seconds, slowest rank), metadata.json's bytes and entries (shard
// file tensors), load_checkpoint at the same mesh, and at the other one (t2's save into t1, t1's
// into t2: the resharding paths). Files are read after evicting their pages where the kernel
// allows (posix_fadvise DONTNEED per file), so loads include the disk. Each figure is the median
// of --reps runs (default 3; the machine is shared), the fastest in brackets.
// --small: 4 layers, d 256, vocabulary 4096 (checks the program).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"

using namespace sw;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Mesh {
  GroupPtr tensor, data;
  std::unique_ptr<Model> model;
  std::unique_ptr<ShardedModel> sm;
};

Mesh make(const GroupPtr& w, int t, const ModelConfig& mc) {
  Mesh m;
  const int r = w->rank();
  m.tensor = t > 1 ? w->split(r / t, r) : nullptr;
  m.data = t > 1 ? (w->size() / t > 1 ? w->split(r % t, r) : make_local_group()) : w;
  m.model = std::make_unique<Model>(build_model(mc, TensorSlice{r % t, t}));
  m.sm = std::make_unique<ShardedModel>(*m.model, ops_for(Device::cpu()), 1, m.data,
                                        ShardingPolicy::for_strategy(ShardingStrategy::FullShard),
                                        m.tensor);
  return m;
}

double slowest(Group& w, double s) {
  float f = static_cast<float>(s);
  w.all_reduce(&f, &f, 1, ReduceOp::Max);
  return f;
}

// "median s (best s)" of the runs.
std::string figure(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  char b[64];
  std::snprintf(b, sizeof b, "%.2f s (best %.2f)", v[v.size() / 2], v[0]);
  return b;
}

void evict(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  GroupPtr w = world_group();
  set_num_threads(1);
  std::string dir = "/tmp/bench_tp_ckpt";
  bool small = false;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--small") == 0)
      small = true;
    else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--help") == 0) {
      std::printf("usage: mpirun -np 2 bench_tp_ckpt [DIR] [--small] [--reps N]\n");
      return 0;
    } else
      dir = argv[i];
  }
  ModelConfig mc;
  mc.type = "gpt2";
  mc.vocab_size = small ? 4096 : 50304;
  mc.n_layer = small ? 4 : 12;
  mc.n_head = small ? 4 : 12;
  mc.d_model = small ? 256 : 768;
  mc.seq_len = small ? 256 : 1024;
  const int W = w->size();
  if (w->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::printf("bench_tp_ckpt: %d ranks, GPT-2 %d layers d %d vocab %d, dir %s\n", W,
                mc.n_layer, mc.d_model, mc.vocab_size, dir.c_str());
  }
  w->barrier();
  const int ts[2] = {1, 2};
  TrainState st;
  st.step = 1;
  for (int t : ts) {
    if (W % t) continue;
    Mesh m = make(w, t, mc);
    const std::string d = dir + "/t" + std::to_string(t);
    std::vector<double> save_s;
    for (int i = 0; i < reps; ++i) {
      w->barrier();
      const double t0 = now();
      save_checkpoint(*m.sm, st, d, w.get());  // (the same step again: replaces it)
      save_s.push_back(slowest(*w, now() - t0));
    }
    if (w->rank() == 0) {
      const auto bytes = std::filesystem::file_size(d + "/metadata.json");
      std::ifstream in(d + "/metadata.json");
      const nlohmann::json j = nlohmann::json::parse(in);
      size_t entries = 0, per_row = 0;
      // Design (a)'s count, for comparison: v1-style flat ranges of the logical layout need one
      // per row where a block has only some of the columns (a row-parallel weight's part).
      std::map<std::string, int64_t> cols;
      for (const auto& u : j["units"])
        for (const auto& p : u["params"]) {
          int64_t c = 1;
          for (size_t i = 1; i < p["shape"].size(); ++i) c *= p["shape"][i].get<int64_t>();
          cols[p["name"].get<std::string>()] = c;
        }
      for (const auto& f : j["files"])
        for (const auto& t : f["tensors"]) {
          ++entries;
          if (!t.contains("cols")) continue;
          const bool part = t["cols"][0] != 0 || t["cols"][1] != cols[t["param"].get<std::string>()];
          per_row += part ? t["rows"][1].get<int64_t>() - t["rows"][0].get<int64_t>() : 1;
        }
      std::printf("t%d save                %s   metadata.json %zu bytes, %zu entries (v%d)\n", t,
                  figure(save_s).c_str(), static_cast<size_t>(bytes), entries,
                  j["format_version"].get<int>());
      if (per_row) std::printf("   (flat ranges of the logical layout would need %zu)\n", per_row);
    }
  }
  for (int t : ts) {
    if (W % t) continue;
    Mesh m = make(w, t, mc);
    for (int from : ts) {
      if (W % from) continue;
      const std::string d = dir + "/t" + std::to_string(from);
      std::vector<double> load_s;
      for (int i = 0; i < reps; ++i) {
        if (w->rank() == 0) evict(d);
        w->barrier();
        const double t0 = now();
        load_checkpoint(*m.sm, d);
        load_s.push_back(slowest(*w, now() - t0));
      }
      if (w->rank() == 0)
        std::printf("t%d load of t%d's save   %s\n", t, from, figure(load_s).c_str());
    }
  }
  w->barrier();
  if (w->rank() == 0) std::filesystem::remove_all(dir);
  return 0;
}
