// The end-of-run export on 2 ranks, run by ctest as `mpirun -np 2` (labels mpi, reference): a Llama
// with GQA trained FULL_SHARD exports a directory cut into several files; each rank writes the
// files it owns (file k by rank k mod 2) and nothing more, the files equal a one-rank export of the
// same weights, and transformers' AutoModelForCausalLM gives the 2-rank model's logits within 1e-4
// (tests/checkpoint/hf_export_check.py, run by rank 0).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/hf_export.h"
#include "sharding/policy.h"
#include "sharding/sharded_model.h"
#include "tests/common/mpi_test_util.h"

using namespace sw;
using namespace swtest;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST_CASE("hf export on 2 ranks: each rank writes its own files, transformers loads them",
          "[hf_export_mpi]") {
  GroupPtr w = world();
  REQUIRE(w->size() == 2);
  const int rank = w->rank();
  const std::string root = std::string(SW_BINARY_DIR) + "/hf_export_mpi";
  if (rank == 0) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  w->barrier();
  ModelConfig c = tiny_config("llama");
  c.vocab_size = 96;
  c.d_model = 64;
  c.tie_embeddings = false;
  Model m = build_model(c);
  ShardedModel sm(m, cpu(), 21, w, ShardingPolicy::for_strategy(ShardingStrategy::FullShard));
  const Corpus corpus(c.vocab_size);
  const int B = 2, T = 16;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int s = 1; s <= 3; ++s) {
    corpus.fill(s, rank * B, B, T, in.data(), tg.data());
    Batch b;
    b.B = B, b.T = T, b.tokens = in.data(), b.targets = tg.data();
    sm.zero_grads();
    sm.forward_backward(b);
    sm.optimizer_step(AdamWParams{}, 1e-2f, 1.f, s);
  }
  HfExportOptions o;
  o.max_shard_bytes = 60000;
  HfExportStats st;
  export_hf_dir(sm, root + "/llama_gqa", o, &st);
  // Both ranks wrote files; together every tensor byte once.
  CHECK(st.files >= 1);
  CHECK(st.bytes > 0);
  std::vector<float> mine = {float(st.bytes)}, all(2);
  w->all_gather(mine.data(), all.data(), 1);
  const auto idx = nlohmann::json::parse(slurp(root + "/llama_gqa/model.safetensors.index.json"));
  CHECK(uint64_t(all[0]) + uint64_t(all[1]) == idx["metadata"]["total_size"].get<uint64_t>());

  // Shardwise's logits (collective), then rank 0 runs transformers on them.
  const int LB = 3, LT = 11, V = c.vocab_size;
  std::vector<int32_t> ids(LB * LT);
  for (int i = 0; i < LB * LT; ++i) ids[size_t(i)] = (i * 29 + 7) % V;
  Batch lb;
  lb.B = LB, lb.T = LT, lb.tokens = ids.data();
  std::vector<float> lg(size_t(LB * V));
  sm.logits_last(lb, lg.data());

  // The same weights on one rank export the same bytes.
  sm.gather_full_params();
  std::vector<std::pair<std::string, std::vector<float>>> full;
  sm.for_each_param([&](const ParamSpec& s, const float* d) {
    full.push_back({s.name, std::vector<float>(d, d + numel(s.shape))});
  });
  sm.release_full_params();
  if (rank == 0) {
    Model m1 = build_model(c);
    ShardedModel one(m1, cpu(), 3);
    for (auto& [n, v] : full) one.set_param(n, v.data(), int64_t(v.size()));
    export_hf_dir(one, root + "/one", o);
    std::set<std::string> files;
    for (auto& [k, v] : idx["weight_map"].items()) files.insert(v.get<std::string>());
    CHECK(files.size() >= 3);
    for (const std::string& f : files)
      CHECK(slurp(root + "/one/" + f) == slurp(root + "/llama_gqa/" + f));

    std::ofstream f(root + "/llama_gqa.logits", std::ios::binary);
    const int32_t h[3] = {LB, LT, V};
    f.write(reinterpret_cast<const char*>(h), sizeof h);
    f.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 4));
    f.write(reinterpret_cast<const char*>(lg.data()), std::streamsize(lg.size() * 4));
    f.close();
    const std::string cmd = std::string(SW_REF_PYTHON) + " " + SW_SOURCE_DIR +
                            "/tests/checkpoint/hf_export_check.py check " + root + " llama_gqa";
    INFO(cmd);
    CHECK(std::system(cmd.c_str()) == 0);
  }
  w->barrier();
}
