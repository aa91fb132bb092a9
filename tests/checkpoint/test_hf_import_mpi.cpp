// Importing on several ranks (checkpoint/hf_import.h), part of the `mpirun -np 4` checkpoint
// launch (test_ckpt_mpi): rank 0 exports a one-rank model's weights (its own seed); every rank
// then imports them into a model sharded over the world with another seed. Each rank must read
// only the tensors it holds part of (ShardedModel::holds_param: under FULL_SHARD fewer than all,
// together all of them, under NO_SHARD all), and the gathered parameters must equal the
// exported ones bit for bit (GPT-2: Conv1D weights transposed by row blocks; a tied Llama with
// q/k/v biases). Only CHECK is used after the barrier, and importing never communicates.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/export.h"
#include "checkpoint/hf_import.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "tests/common/mpi_test_util.h"

using namespace sw;

TEST_CASE("hf import on N ranks: each rank reads what it holds, the weights arrive whole") {
  const GroupPtr w = swtest::world();
  const int W = w->size(), rank = w->rank();
  const std::string dir =
      (std::filesystem::temp_directory_path() / "sw_hf_import_mpi").string();
  for (const char* type : {"gpt2", "llama"}) {
    ModelConfig c = swtest::tiny_config(type);
    if (c.type == "llama") c.tie_embeddings = true, c.qkv_bias = true;
    INFO(type);
    const std::string file = dir + "/" + type + ".safetensors";
    // The source: one rank's model with seed 5, written by rank 0.
    Model src = build_model(c);
    ShardedModel one(src, swtest::cpu(), 5);
    std::map<std::string, std::vector<float>> want;
    one.for_each_param([&](const ParamSpec& s, const float* p) {
      want[s.name].assign(p, p + numel(s.shape));
    });
    if (rank == 0) {
      std::filesystem::create_directories(dir);
      export_hf_safetensors(one, file);
    }
    w->barrier();
    for (ShardingStrategy st : {ShardingStrategy::FullShard, ShardingStrategy::NoShard}) {
      INFO(strategy_name(st));
      Model m = build_model(c);
      ShardedModel sm(m, swtest::cpu(), 9, w, ShardingPolicy::for_strategy(st));
      int held = 0, all = 0;  // held: the tensors the import read on this rank
      for (int u = 0; u < sm.num_units(); ++u) all += int(sm.unit_layout(u).specs.size());
      import_hf_weights(sm, file, &held);
      if (st == ShardingStrategy::NoShard || W == 1)
        CHECK(held == all);
      else
        CHECK(held < all);
      CHECK(swtest::sum_doubles(*w, held) >= all);  // together, every tensor
      sm.for_each_param([&](const ParamSpec& s, const float* p) {
        INFO(s.name);
        CHECK(std::vector<float>(p, p + numel(s.shape)) == want.at(s.name));
      });
    }
    w->barrier();
  }
  if (rank == 0) std::filesystem::remove_all(dir);
}
