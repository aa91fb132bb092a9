// Checkpoints across mesh shapes (issue 36), run by ctest as `mpirun -np 4` (label mpi). A mesh
// is the first t x D ranks: tensor groups of t consecutive ranks, data groups of the ranks with
// the same tensor rank (tests/sharding/test_tensor_parallel_mpi.cpp's construction).
//
// Resharding: a tiny GPT-2 and a Llama (GQA) are built at a mesh, and every rank sets what it holds
// of master, m and v to a pure function of (parameter name, kind, LOGICAL index)
// (ParamSpec::split.logical_index), alignment gaps zero; saved at t2 x FULL_SHARD 2, t2 x NO_SHARD
// 2, t4 and t1 x FULL_SHARD 4 (a v1 checkpoint); each is loaded at t1 x 4, t4, t2 x 1, one rank, t2
// x SHARD_GRAD_OP 2, t2 x SHARD_OPTIMIZER 2 (the whole master held) and t2 x FULL_SHARD 2 (also
// with blocks_per_unit 2: other units, parameters found by name), over state scribbled with NaN.
// Every element every rank holds afterwards must equal the function bit for bit (the ranks together
// hold every logical element). verify passes on every save; the consolidated export of each
// tensor-parallel save is byte for byte the export of the t1 (v1) save of the same logical state; a
// v2 metadata with a block moved onto its neighbour's rows is refused; a gpt2 save into a llama
// lists the differences.
// Resume: 3 AdamW steps at t2 x FULL_SHARD 2, saved; 3 more steps there, and 3 more after loading
// at t2 x 2 again, t1 x 4, one rank and t4 x SHARD_GRAD_OP: the same losses (bitwise at the same
// mesh, within 1e-5 relative across meshes: fp32 summation order, the parity tests' tolerance).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/crc32c.h"
#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "sharding/wrap.h"
#include "tests/common/mpi_test_util.h"

using namespace sw;
using SK = ShardedModel::StateKind;

namespace {

using swtest::cpu;
using swtest::world;

ModelConfig tiny(const std::string& type) {
  ModelConfig c = swtest::tiny_config(type);
  c.n_head = 4;  // divisible by 4 tensor ranks
  c.vocab_size = 64;
  c.seq_len = 16;
  c.d_model = 40;  // units not multiples of the shard counts: ragged ranges
  if (type == "llama") c.n_kv_head = 2, c.d_ff = 48;  // KV split at t 2, replicated at t 4
  return c;
}

struct MeshSpec {
  int t, D;
  ShardingStrategy s;
  const char* name;
  int blocks_per_unit = 1;
};

// This rank's part of a mesh over the first t*D world ranks (null sm on the others).
struct Mesh {
  GroupPtr sub, tensor, data;
  std::unique_ptr<Model> model;
  std::unique_ptr<ShardedModel> sm;
};

Mesh make_mesh(const MeshSpec& ms, const ModelConfig& mc, uint64_t seed = 7) {
  const GroupPtr w = world();
  const int n = ms.t * ms.D, rank = w->rank();
  Mesh m;
  m.sub = w->split(rank < n ? 0 : 1, rank);
  if (rank >= n) return m;
  const int r = m.sub->rank(), t = ms.t, D = ms.D;
  m.tensor = t > 1 ? m.sub->split(r / t, r) : nullptr;
  m.data = t > 1 ? (D > 1 ? m.sub->split(r % t, r) : make_local_group()) : m.sub;
  m.model = std::make_unique<Model>(build_model(mc, TensorSlice{r % t, t}));
  wrap_blocks(*m.model, ms.blocks_per_unit);
  m.sm = std::make_unique<ShardedModel>(*m.model, cpu(), seed, m.data,
                                        ShardingPolicy::for_strategy(ms.s), m.tensor);
  return m;
}

// The reference state: exactly representable, distinct per (parameter, kind, logical index).
float value(const std::string& name, int k, int64_t li) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return static_cast<float>((h % 7919 + uint64_t(k) * 104729 + uint64_t(li)) % 1000003) * 0.001f -
         17.f;
}

// What this rank holds of unit u, kind k, as the reference says it should be (gaps zero).
std::vector<float> expected(const ShardedModel& sm, int u, int k) {
  const FlatRange h = sm.held_range(u, static_cast<SK>(k));
  std::vector<float> v(static_cast<size_t>(h.size()), 0.f);
  const FlatLayout& L = sm.unit_layout(u);
  for (size_t s = 0; s < L.specs.size(); ++s) {
    const ParamSpec& p = L.specs[s];
    const int64_t off = L.entries[s].offset, n = L.entries[s].numel;
    for (int64_t i = std::max(h.lo, off); i < std::min(h.hi, off + n); ++i)
      v[size_t(i - h.lo)] = value(p.name, k, p.split.logical_index(i - off, p.shape));
  }
  return v;
}

void set_reference(ShardedModel& sm) {
  for (int u = 0; u < sm.num_units(); ++u)
    for (int k = 0; k < 3; ++k) {
      const std::vector<float> v = expected(sm, u, k);
      sm.write_state(u, static_cast<SK>(k), sm.held_range(u, static_cast<SK>(k)), v.data());
    }
}

// Elements of this rank's held state that differ from the reference (bitwise).
int64_t mismatches(const ShardedModel& sm) {
  int64_t bad = 0;
  for (int u = 0; u < sm.num_units(); ++u)
    for (int k = 0; k < 3; ++k) {
      const FlatRange h = sm.held_range(u, static_cast<SK>(k));
      std::vector<float> got(static_cast<size_t>(h.size()));
      sm.read_state(u, static_cast<SK>(k), h, got.data());
      const std::vector<float> want = expected(sm, u, k);
      for (size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0;
    }
  return bad;
}

std::string base_dir() { return std::string(SW_BINARY_DIR) + "/tp_ckpt_test_mpi"; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const MeshSpec kSaves[] = {{2, 2, ShardingStrategy::FullShard, "t2xFULL_SHARD2"},
                           {2, 2, ShardingStrategy::NoShard, "t2xNO_SHARD2"},
                           {4, 1, ShardingStrategy::FullShard, "t4"},
                           {1, 4, ShardingStrategy::FullShard, "t1xFULL_SHARD4"}};
const MeshSpec kLoads[] = {{1, 4, ShardingStrategy::FullShard, "t1xFULL_SHARD4"},
                           {4, 1, ShardingStrategy::FullShard, "t4"},
                           {2, 1, ShardingStrategy::FullShard, "t2"},
                           {1, 1, ShardingStrategy::FullShard, "one rank"},
                           {2, 2, ShardingStrategy::ShardGradOp, "t2xSHARD_GRAD_OP2"},
                           {2, 2, ShardingStrategy::ShardOptimizer, "t2xSHARD_OPTIMIZER2"},
                           {2, 2, ShardingStrategy::FullShard, "t2xFULL_SHARD2"},
                           {2, 2, ShardingStrategy::FullShard, "t2xFULL_SHARD2 blocks_per_unit 2", 2}};

}  // namespace

TEST_CASE("checkpoint across mesh shapes: every logical element bit for bit", "[tp_ckpt]") {
  const GroupPtr w = world();
  REQUIRE(w->size() == 4);
  const int rank = w->rank();
  if (rank == 0) {
    std::filesystem::remove_all(base_dir());
    std::filesystem::create_directories(base_dir());
  }
  w->barrier();
  for (const std::string type : {"gpt2", "llama"}) {
    const ModelConfig mc = tiny(type);
    for (const MeshSpec& ms : kSaves) {
      Mesh m = make_mesh(ms, mc);
      if (!m.sm) continue;
      set_reference(*m.sm);
      TrainState ts;
      ts.step = 5 + static_cast<int>(&ms - kSaves);
      try {
        save_checkpoint(*m.sm, ts, base_dir() + "/" + type + "_" + ms.name, m.sub.get());
      } catch (const std::exception& e) {
        FAIL_CHECK("save " << type << " " << ms.name << ": " << e.what());
      }
    }
    w->barrier();
    const std::string one = base_dir() + "/" + type + "_t1xFULL_SHARD4";
    if (rank == 0) {
      for (const MeshSpec& ms : kSaves) {
        const std::string dir = base_dir() + "/" + type + "_" + ms.name;
        try {
          verify_checkpoint(dir);
          const nlohmann::json j = nlohmann::json::parse(slurp(dir + "/metadata.json"));
          CHECK(j["format_version"] == (ms.t > 1 ? 2 : 1));
          CHECK(j["world_size"] == ms.t * ms.D);
          if (ms.t > 1) CHECK(inspect_checkpoint(dir).find("tensor parallel " + std::to_string(ms.t)) != std::string::npos);
          export_checkpoint(dir, dir + ".safetensors");
        } catch (const std::exception& e) {
          FAIL_CHECK(dir << ": " << e.what());
        }
      }
      // One consolidated file of logical tensors: the same bytes whatever the mesh that saved.
      const std::string ref = slurp(one + ".safetensors");
      CHECK(ref.size() > 1000);
      for (const MeshSpec& ms : kSaves) {
        INFO(type << " export of " << ms.name);
        CHECK(slurp(base_dir() + "/" + type + "_" + ms.name + ".safetensors") == ref);
      }
    }
    for (const MeshSpec& ls : kLoads) {
      Mesh m = make_mesh(ls, mc, 99);
      if (!m.sm) continue;
      for (const MeshSpec& ms : kSaves) {
        const std::string dir = base_dir() + "/" + type + "_" + ms.name;
        for (int u = 0; u < m.sm->num_units(); ++u)
          for (int k = 0; k < 3; ++k) {
            const FlatRange h = m.sm->held_range(u, static_cast<SK>(k));
            std::vector<float> junk(static_cast<size_t>(h.size()), NAN);
            m.sm->write_state(u, static_cast<SK>(k), h, junk.data());
          }
        INFO(type << ": saved at " << ms.name << ", loaded at " << ls.name << " (rank " << rank
                  << ")");
        try {
          const TrainState st = load_checkpoint(*m.sm, dir);
          CHECK(st.step == 5 + static_cast<int>(&ms - kSaves));
        } catch (const std::exception& e) {
          FAIL_CHECK(e.what());
          continue;
        }
        CHECK(mismatches(*m.sm) == 0);
      }
    }
    w->barrier();
  }
  // A v2 checkpoint of another model: every difference in one line.
  {
    Mesh m = make_mesh({2, 2, ShardingStrategy::FullShard, "t2xFULL_SHARD2"}, tiny("llama"));
    std::string err;
    try {
      load_checkpoint(*m.sm, base_dir() + "/gpt2_t2xFULL_SHARD2");
    } catch (const Error& e) {
      err = e.what();
    }
    INFO(err);
    CHECK(err.find("the checkpoint's model differs from this one") != std::string::npos);
    CHECK(err.find("model_config.type: checkpoint \"gpt2\", model \"llama\"") != std::string::npos);
  }
  // A v2 block moved up a row (same size, the metadata resealed) overlaps the block above it:
  // refused by the coverage check, naming both.
  if (rank == 0) {
    const std::string dir = base_dir() + "/gpt2_t2xFULL_SHARD2";
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(slurp(dir + "/metadata.json"));
    j.erase("metadata_crc32c");
    bool moved = false;
    for (auto& f : j["files"])
      for (auto& t : f["tensors"])
        if (!moved && t["rows"][0].get<int64_t>() > 0) {
          t["rows"][0] = t["rows"][0].get<int64_t>() - 1;
          t["rows"][1] = t["rows"][1].get<int64_t>() - 1;
          moved = true;
        }
    REQUIRE(moved);
    const std::string body = j.dump();
    j["metadata_crc32c"] = crc32c(body.data(), body.size());
    std::string err;
    try {
      check_checkpoint_metadata(dir + "/metadata.json", j.dump(1));
    } catch (const Error& e) {
      err = e.what();
    }
    INFO(err);
    CHECK(err.find("overlap") != std::string::npos);
  }
  w->barrier();
}

namespace {

// `steps` AdamW steps on rows chosen by (step, global row); the mean loss over the mesh's data
// ranks per step.
std::vector<double> train_steps(Mesh& m, const MeshSpec& ms, int first, int steps) {
  const ModelConfig& mc = m.model->config;
  const int B = 4 / ms.D, T = mc.seq_len, d = m.sub->rank() / ms.t;
  swtest::Corpus corpus(mc.vocab_size);
  std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
  const Batch batch{in.data(), tg.data(), B, T};
  std::vector<double> out;
  for (int s = first; s < first + steps; ++s) {
    m.sm->zero_grads();
    corpus.fill(s, int64_t{d} * B, B, T, in.data(), tg.data());
    const double loss = m.sm->forward_backward(batch);
    out.push_back(swtest::sum_doubles(*m.data, loss) / ms.D);
    m.sm->grad_norm();
    m.sm->optimizer_step(AdamWParams{}, 3e-3f, 1.f, s + 1);
  }
  return out;
}

}  // namespace

TEST_CASE("checkpoint across mesh shapes: a resumed run continues", "[tp_ckpt]") {
  const GroupPtr w = world();
  const int rank = w->rank();
  const std::string dir = base_dir() + "/resume_step3";
  for (const std::string type : {"gpt2", "llama"}) {
    const ModelConfig mc = tiny(type);
    const MeshSpec a{2, 2, ShardingStrategy::FullShard, "t2xFULL_SHARD2"};
    std::vector<double> cont;
    {
      Mesh m = make_mesh(a, mc);
      train_steps(m, a, 0, 3);
      TrainState ts;
      ts.step = 3;
      save_checkpoint(*m.sm, ts, dir, m.sub.get());
      cont = train_steps(m, a, 3, 3);
    }
    w->barrier();
    const MeshSpec bs[] = {a,
                           {1, 4, ShardingStrategy::FullShard, "t1xFULL_SHARD4"},
                           {1, 1, ShardingStrategy::FullShard, "one rank"},
                           {4, 1, ShardingStrategy::ShardGradOp, "t4"}};
    for (const MeshSpec& b : bs) {
      Mesh m = make_mesh(b, mc, 1234);  // (other initial weights: the load must replace them)
      if (!m.sm) continue;
      INFO(type << " resumed at " << b.name << " (rank " << rank << ")");
      CHECK(load_checkpoint(*m.sm, dir).step == 3);
      const std::vector<double> got = train_steps(m, b, 3, 3);
      for (size_t i = 0; i < got.size(); ++i) {
        if (&b == bs)
          CHECK(std::memcmp(&got[i], &cont[i], sizeof(double)) == 0);
        else
          CHECK(std::fabs(got[i] - cont[i]) <= 1e-5 * std::fabs(cont[i]));
      }
    }
    w->barrier();
  }
}
