// Checkpoints across pipeline degrees (issue 37 point 4), run by ctest as `mpirun -np 4` (label
// mpi). A mesh is the first P x t x D ranks as engine/trainer.cpp builds it: pipeline rank
// r / (t D) outermost, tensor groups of t consecutive ranks inside a stage, data groups of the
// ranks with the same tensor rank; each rank's model is its stage (stage_model).
//
// A 3-layer GPT-2 (tied: the embed_head unit is on the first and the last stage) and Llama
// (untied, GQA): every rank sets what it holds of master, m and v to a pure function of
// (parameter name, kind, logical index); saved at P2 x FULL_SHARD 2, P2 x tensor 2 (v2), P4 and
// one rank (P1); each loaded at one rank, P1 x FULL_SHARD 4, P2 x SHARD_GRAD_OP 2, P4 and P2 x
// tensor 2 over state scribbled with NaN. Every element every rank holds must then equal the
// function bit for bit, and every byte range a rank read (LoadStats spans) must lie in a tensor
// of a unit its stage holds. The pipeline saves' metadata lists the one-rank save's units, with
// each unit's tensors in the files of one stage's ranks only (the tied unit: the first stage's);
// verify passes; the consolidated export of every save is byte for byte the one-rank save's; the
// live Hugging Face directory export of the P2 x 2 and P4 meshes (files cut small, so they
// span stages) is byte for byte `ckpt export` of the one-rank save into a directory.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/hf_export.h"
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
namespace fs = std::filesystem;

namespace {

using swtest::cpu;
using swtest::world;

struct MeshSpec {
  int P, t, D;
  ShardingStrategy s;
  const char* name;
};

// This rank's part of a mesh over the first P t D world ranks (null sm on the others).
struct Mesh {
  GroupPtr sub, stage, pipe, tensor, data;
  std::unique_ptr<Model> model;
  std::unique_ptr<ShardedModel> sm;
};

Mesh make_mesh(const MeshSpec& ms, const ModelConfig& mc) {
  const GroupPtr w = world();
  const int n = ms.P * ms.t * ms.D, rank = w->rank();
  Mesh m;
  m.sub = w->split(rank < n ? 0 : 1, rank);
  if (rank >= n) return m;
  const int r = m.sub->rank(), t = ms.t, D = ms.D, per = t * D;
  const int pr = r / per, sr = r % per;
  m.stage = ms.P > 1 ? m.sub->split(pr, r) : m.sub;
  if (ms.P > 1) m.pipe = m.sub->split(sr, pr);
  m.tensor = t > 1 ? m.stage->split(sr / t, sr) : nullptr;
  m.data = t > 1 ? (D > 1 ? m.stage->split(sr % t, sr) : make_local_group()) : m.stage;
  Model whole = build_model(mc, TensorSlice{sr % t, t});
  wrap_blocks(whole, 1);
  if (ms.P > 1) {
    const int npos = static_cast<int>(whole.schedule.size());
    std::vector<int> bounds;
    for (int g = 0; g <= ms.P; ++g) bounds.push_back(g * npos / ms.P);
    whole = stage_model(std::move(whole), bounds, ms.P, 1, pr);
  }
  m.model = std::make_unique<Model>(std::move(whole));
  m.sm = std::make_unique<ShardedModel>(*m.model, cpu(), 7, m.data,
                                        ShardingPolicy::for_strategy(ms.s), m.tensor,
                                        PipeSetup{m.pipe, 0});
  return m;
}

// The reference state: exactly representable, distinct per (parameter, kind, logical index).
float value(const std::string& name, int k, int64_t li) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return static_cast<float>((h % 7919 + uint64_t(k) * 104729 + uint64_t(li)) % 1000003) * 0.001f -
         17.f;
}

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

void fill(ShardedModel& sm, bool nan) {
  for (int u = 0; u < sm.num_units(); ++u)
    for (int k = 0; k < 3; ++k) {
      std::vector<float> v = expected(sm, u, k);
      if (nan) std::fill(v.begin(), v.end(), std::nanf(""));
      sm.write_state(u, static_cast<SK>(k), sm.held_range(u, static_cast<SK>(k)), v.data());
    }
}

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

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string base_dir() { return std::string(SW_BINARY_DIR) + "/pipeline_ckpt_test_mpi"; }

// The global units this rank's stage holds.
std::set<int> held_units(ShardedModel& sm) {
  std::set<int> s;
  const StageView& sv = sm.model().stage;
  for (int u = 0; u < sm.num_units(); ++u) s.insert(sv.split() ? sv.global_unit[size_t(u)] : u);
  return s;
}

// Spans of `st` outside every tensor of a unit in `units` (metadata.json of `dir`).
int stray_spans(const std::string& dir, const LoadStats& st, const std::set<int>& units) {
  const nlohmann::json m = nlohmann::json::parse(slurp(dir + "/metadata.json"));
  int bad = 0;
  for (const LoadStats::Span& sp : st.spans) {
    bool ok = false;
    for (const auto& f : m["files"])
      if (f["file"] == sp.file)
        for (const auto& t : f["tensors"]) {
          const uint64_t a = t["offset"], b = a + t["bytes"].get<uint64_t>();
          if (sp.begin >= a && sp.end <= b && units.count(t["unit"].get<int>())) ok = true;
        }
    bad += !ok;
  }
  return bad;
}

const MeshSpec kSaves[] = {{2, 1, 2, ShardingStrategy::FullShard, "P2xFULL_SHARD2"},
                           {2, 2, 1, ShardingStrategy::FullShard, "P2xt2"},
                           {4, 1, 1, ShardingStrategy::FullShard, "P4"},
                           {1, 1, 1, ShardingStrategy::FullShard, "one"}};
const MeshSpec kLoads[] = {{1, 1, 1, ShardingStrategy::FullShard, "one rank"},
                           {1, 1, 4, ShardingStrategy::FullShard, "P1xFULL_SHARD4"},
                           {2, 1, 2, ShardingStrategy::ShardGradOp, "P2xSHARD_GRAD_OP2"},
                           {4, 1, 1, ShardingStrategy::FullShard, "P4"},
                           {2, 2, 1, ShardingStrategy::FullShard, "P2xt2"}};

}  // namespace

TEST_CASE("checkpoints across pipeline degrees: every element bit for bit", "[pipeline_ckpt]") {
  const GroupPtr w = world();
  REQUIRE(w->size() == 4);
  const int rank = w->rank();
  if (rank == 0) {
    fs::remove_all(base_dir());
    fs::create_directories(base_dir());
  }
  w->barrier();
  for (const std::string type : {"gpt2", "llama"}) {
    ModelConfig mc = swtest::tiny_config(type, 3);
    for (const MeshSpec& ms : kSaves) {
      Mesh m = make_mesh(ms, mc);
      if (!m.sm) continue;
      fill(*m.sm, false);
      TrainState ts;
      ts.step = 3;
      try {
        save_checkpoint(*m.sm, ts, base_dir() + "/" + type + "_" + ms.name, m.sub.get());
      } catch (const std::exception& e) {
        FAIL_CHECK("save " << type << " " << ms.name << ": " << e.what());
      }
    }
    w->barrier();
    const std::string one = base_dir() + "/" + type + "_one";
    if (rank == 0) {
      const nlohmann::json ref = nlohmann::json::parse(slurp(one + "/metadata.json"));
      export_checkpoint(one, one + ".safetensors");
      const std::string ref_export = slurp(one + ".safetensors");
      for (const MeshSpec& ms : kSaves) {
        if (ms.P == 1) continue;
        const std::string dir = base_dir() + "/" + type + "_" + ms.name;
        INFO(type << " " << ms.name);
        try {
          verify_checkpoint(dir);
          const nlohmann::json j = nlohmann::json::parse(slurp(dir + "/metadata.json"));
          CHECK(j["units"] == ref["units"]);
          CHECK(j["pipeline_parallel_degree"] == ms.P);
          CHECK(j["world_size"] == ms.P * ms.t * ms.D);
          CHECK(j["format_version"] == (ms.t > 1 ? 2 : 1));
          // Each unit's tensors are in the files of one stage's ranks (rank r: stage r / (t D)).
          std::map<int, std::set<int>> stages;
          for (const auto& f : j["files"])
            for (const auto& t : f["tensors"])
              stages[t["unit"].get<int>()].insert(f["rank"].get<int>() / (ms.t * ms.D));
          CHECK(stages.size() == ref["units"].size());
          for (const auto& [u, s] : stages) CHECK(s.size() == 1);
          CHECK(stages[0] == std::set<int>{0});  // the embedding (tied: the head too) by stage 0
          CHECK(inspect_checkpoint(dir).find("pipeline parallel " + std::to_string(ms.P)) !=
                std::string::npos);
          export_checkpoint(dir, dir + ".safetensors");
          CHECK(slurp(dir + ".safetensors") == ref_export);
        } catch (const std::exception& e) {
          FAIL_CHECK(dir << ": " << e.what());
        }
      }
      HfExportOptions o;
      o.max_shard_bytes = 20000;
      export_checkpoint(one, one + "_hf", o);
    }
    w->barrier();
    for (const MeshSpec& save : kSaves)
      for (const MeshSpec& ld : kLoads) {
        Mesh m = make_mesh(ld, mc);
        if (!m.sm) continue;
        INFO(type << ": saved at " << save.name << ", loaded at " << ld.name << ", rank " << rank);
        fill(*m.sm, true);
        const std::string dir = base_dir() + "/" + type + "_" + save.name;
        LoadStats st;
        try {
          const TrainState ts = load_checkpoint(*m.sm, dir, &st);
          CHECK(ts.step == 3);
        } catch (const std::exception& e) {
          FAIL_CHECK(e.what());
        }
        CHECK(mismatches(*m.sm) == 0);
        CHECK(st.payload_bytes > 0);
        CHECK(stray_spans(dir, st, held_units(*m.sm)) == 0);
      }
    // The live export of pipeline meshes: the one-rank save's `ckpt export`, byte for byte.
    for (const MeshSpec& ms : {kSaves[0], kSaves[2]}) {
      const std::string out = base_dir() + "/" + type + "_" + ms.name + "_hf";
      {
        Mesh m = make_mesh(ms, mc);
        if (m.sm) {
          fill(*m.sm, false);
          HfExportOptions o;
          o.max_shard_bytes = 20000;
          HfExportStats stats;
          try {
            export_hf_dir(*m.sm, out, o, &stats, m.sub.get());
          } catch (const std::exception& e) {
            FAIL_CHECK(ms.name << ": " << e.what());
          }
        }
      }
      w->barrier();
      if (rank == 0) {
        INFO(type << " live export at " << ms.name);
        std::vector<std::string> a, b;
        for (const auto& e : fs::directory_iterator(out)) a.push_back(e.path().filename());
        for (const auto& e : fs::directory_iterator(one + "_hf")) b.push_back(e.path().filename());
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        CHECK(a == b);
        CHECK(a.size() > 4);  // several weights files, an index, config.json
        for (const std::string& f : a) {
          INFO(f);
          CHECK(slurp(out + "/" + f) == slurp(one + "_hf/" + f));
        }
      }
      w->barrier();
    }
  }
}

TEST_CASE("a pipeline stage's export needs the world group", "[pipeline_ckpt]") {
  const GroupPtr w = world();
  Mesh m = make_mesh({2, 1, 2, ShardingStrategy::FullShard, "P2xFULL_SHARD2"},
                     swtest::tiny_config("gpt2", 3));
  if (m.sm) CHECK_THROWS_WITH(export_hf_dir(*m.sm, base_dir() + "/x", HfExportOptions{}),
                              Catch::Contains("pass the world group"));
  w->barrier();
}
