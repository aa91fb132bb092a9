// Sharded checkpoints of a model on a device, checked on the simulated accelerator
// (tests/common/sim_device.h: device memory faults when host code touches it outside the
// device's ops and copies; its arithmetic is the CPU's, so a model on it holds the CPU model's
// numbers bit for bit). A model trained on sim:0 must write exactly the bytes a CPU model
// writes (synchronous save, async snapshot, reused snapshot memory); its checkpoint must load
// into a CPU model and a sim model with master weights, AdamW moments and the step equal to
// the saved ones; training resumed from it (on the sim, and on the CPU) must equal an
// uninterrupted run bit for bit; a CPU checkpoint must resume on the sim the same way; fp32
// and bf16 mixed precision. Also: state_view refuses device memory, and the safetensors
// export / import of a sim model equals the CPU's. (One rank here; test_ckpt_mpi has 2 sim
// ranks with every strategy.)
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/export.h"
#include "checkpoint/sharded_checkpoint.h"
#include "core/alloc.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "tests/checkpoint/ckpt_state_util.h"
#include "tests/common/sim_device.h"

using namespace sw;
using SK = ShardedModel::StateKind;
namespace fs = std::filesystem;

namespace {

const Ops& cpu() { return ops_for(Device::cpu()); }
const Ops& sim() { return ops_for(Device::sim(0)); }

ModelConfig tiny() {
  ModelConfig c;
  c.vocab_size = 48;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = 8;
  return c;
}

// offload: the master and gradient shards and the AdamW moments on the host (offload_param
// and offload_optimizer cpu), which the sim model keeps in host memory beside its device state.
ShardingPolicy policy(DType pdt, bool offload = false) {
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  p.mixed_precision.param_dtype = pdt;
  if (offload) {
    p.offload_param.device = OffloadDevice::Cpu;
    p.offload_optimizer.device = OffloadDevice::Cpu;
  }
  return p;
}

// Optimizer steps first+1 .. last (two micro-steps each, clipping): batches and LR depend on
// the step index only, so a resumed model continues the uninterrupted run's sequence.
std::vector<double> train_steps(ShardedModel& sm, int first, int last) {
  const int B = 2, T = 8, V = 48;
  std::vector<double> losses;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int s = first + 1; s <= last; ++s) {
    sm.zero_grads();
    for (int micro = 0; micro < 2; ++micro) {
      for (int i = 0; i < B * T; ++i)
        in[size_t(i)] = (i * 7 + s * 3 + micro) % V, tg[size_t(i)] = (i * 5 + s + micro) % V;
      Batch b;
      b.B = B, b.T = T, b.tokens = in.data(), b.targets = tg.data();
      losses.push_back(sm.forward_backward(b, 0.5f, micro == 1));
    }
    const double norm = sm.grad_norm();
    losses.push_back(norm);
    sm.optimizer_step(AdamWParams{}, 1e-2f / float(s), norm > 0.5 ? float(0.5 / norm) : 1.f, s);
  }
  return losses;
}

std::map<std::string, std::vector<float>> params(const ShardedModel& sm) {
  std::map<std::string, std::vector<float>> r;
  sm.for_each_param([&](const ParamSpec& s, const float* p) {
    r[s.name].assign(p, p + numel(s.shape));
  });
  return r;
}

bool same_params(const ShardedModel& a, const ShardedModel& b) {
  const auto pa = params(a), pb = params(b);
  if (pa.size() != pb.size()) return false;
  for (const auto& [name, v] : pa) {
    const auto& w = pb.at(name);
    if (v.size() != w.size() || std::memcmp(v.data(), w.data(), v.size() * 4) != 0) return false;
  }
  return true;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The step directory's files, byte for byte.
bool same_files(const std::string& a, const std::string& b) {
  for (const char* f : {"metadata.json", "rank_0.safetensors"})
    if (read_file(fs::path(a) / f) != read_file(fs::path(b) / f)) return false;
  return true;
}

std::string base_dir() {
  const std::string d = std::string(SW_BINARY_DIR) + "/ckpt_test_device";
  fs::create_directories(d);
  return d;
}

TrainState state_at(int step) {
  TrainState ts;
  ts.step = step;
  ts.optimizer_steps = step;
  ts.seed = 1234;
  ts.config_json = "{}";
  return ts;
}

}  // namespace

TEST_CASE("device checkpoint: a sim model saves the CPU's bytes, loads on both, resumes bit for bit",
          "[checkpoint][device]") {
  const ModelConfig cfg = tiny();
  const int K = 3, N = 6;  // save after K steps, train on to N
  for (DType pdt : {DType::F32, DType::BF16})
  for (bool offload : {false, true}) {
    INFO("param_dtype " << dtype_name(pdt) << (offload ? ", state offloaded to the host" : ""));
    const std::string tag = std::string(dtype_name(pdt)) + (offload ? "_offload" : "");
    const std::string d = base_dir() + "/" + tag;
    fs::remove_all(d);
    const ShardingPolicy pol = policy(pdt, offload);
    Model m_cpu = build_model(cfg), m_sim = build_model(cfg);
    {
      ShardedModel mc(m_cpu, cpu(), 1234, make_local_group(), pol);
      ShardedModel md(m_sim, sim(), 1234, make_local_group(), pol);
      REQUIRE(md.state_on_device());
      REQUIRE_FALSE(mc.state_on_device());
      const auto lc = train_steps(mc, 0, K), ld = train_steps(md, 0, K);
      CHECK(lc == ld);
      // The host cannot read device memory in place: state_view refuses, read_state copies.
      CHECK_THROWS_WITH(md.state_view(0, SK::Master, md.held_range(0, SK::Master)),
                        Catch::Contains("read_state"));
      CHECK(ckpttest::same_state(mc, md));

      // Save: CPU sync; sim sync (streamed through the staging ring); sim async snapshot, a
      // second one into the first's memory, and one into reserved memory.
      save_checkpoint(mc, state_at(K), d + "/cpu");
      save_checkpoint(md, state_at(K), d + "/sim_sync");
      SnapshotPtr s1 = snapshot_checkpoint(md, state_at(K));
      write_snapshot(*s1, d + "/sim_async.tmp");
      REQUIRE(commit_checkpoint(md.group(), *s1, true, d + "/sim_async.tmp", d + "/sim_async"));
      SnapshotPtr s2 = snapshot_checkpoint(md, state_at(K), std::move(s1));
      write_snapshot(*s2, d + "/sim_reused.tmp");
      REQUIRE(commit_checkpoint(md.group(), *s2, true, d + "/sim_reused.tmp", d + "/sim_reused"));
      SnapshotPtr s3 = snapshot_checkpoint(md, state_at(K), reserve_snapshot(md));
      write_snapshot(*s3, d + "/sim_reserved.tmp");
      REQUIRE(commit_checkpoint(md.group(), *s3, true, d + "/sim_reserved.tmp", d + "/sim_reserved"));
      for (const char* v : {"sim_sync", "sim_async", "sim_reused", "sim_reserved"}) {
        INFO(v);
        CHECK_NOTHROW(verify_checkpoint(d + "/" + v));
        CHECK(same_files(d + "/cpu", d + "/" + v));
      }
      // Saving changed nothing: the uninterrupted runs go on, still equal.
      const auto lc2 = train_steps(mc, K, N), ld2 = train_steps(md, K, N);
      CHECK(lc2 == ld2);
      CHECK(ckpttest::same_state(mc, md));
      CHECK(same_params(mc, md));

      // Load the sim's checkpoint into a CPU model and a sim model (other seeds: nothing of
      // their own initialisation may survive), and the CPU's into a sim model.
      struct Case {
        const char* name;
        const Ops* ops;
        const char* dir;
      };
      for (const Case& c : {Case{"sim -> cpu", &cpu(), "sim_sync"},
                            Case{"sim -> sim", &sim(), "sim_async"},
                            Case{"cpu -> sim", &sim(), "cpu"}}) {
        INFO(c.name);
        Model m = build_model(cfg);
        ShardedModel r(m, *c.ops, 99, make_local_group(), pol);
        {  // the saved state, bit for bit: a fresh model at step K
          Model m_ref = build_model(cfg);
          ShardedModel ref(m_ref, cpu(), 1234, make_local_group(), pol);
          train_steps(ref, 0, K);
          const TrainState ts = load_checkpoint(r, d + "/" + c.dir);
          CHECK(ts.step == K);
          CHECK(ts.optimizer_steps == K);
          CHECK(ckpttest::same_state(ref, r));
          CHECK(same_params(ref, r));
        }
        // Resumed: the uninterrupted run's losses, norms, weights and moments.
        CHECK(train_steps(r, K, N) == lc2);
        CHECK(ckpttest::same_state(mc, r));
        CHECK(same_params(mc, r));
        // A checkpoint of the resumed model equals the uninterrupted model's.
        save_checkpoint(r, state_at(N), d + "/resumed_" + c.dir);
      }
      save_checkpoint(mc, state_at(N), d + "/cpu_final");
      for (const char* v : {"resumed_sim_sync", "resumed_sim_async", "resumed_cpu"})
        CHECK(same_files(d + "/cpu_final", d + "/" + v));
    }
    CHECK(swtest::sim_device_bytes_in_use() == 0);
  }
}

TEST_CASE("device checkpoint: state in NVMe files: the sim saves the CPU's bytes and resumes",
          "[checkpoint][device]") {
  // offload_optimizer and offload_param nvme on a device: moments, master and gradient shards
  // are read from the files for each update on the CPU (in pieces), for each gather (then
  // copied up) and for the checkpoint.
  const ModelConfig cfg = tiny();
  const int K = 3, N = 5;
  const std::string d = base_dir() + "/nvme";
  fs::remove_all(d);
  auto pol = [&](const std::string& who) {
    ShardingPolicy p = policy(DType::BF16);
    p.offload_optimizer.device = OffloadDevice::Nvme;
    p.offload_optimizer.nvme_path = d + "/files_" + who;  // one file per model
    p.offload_optimizer.piece_floats = 300;
    p.offload_param.device = OffloadDevice::Nvme;  // the master and gradient shards too
    p.offload_param.nvme_path = d + "/files_" + who;
    return p;
  };
  Model m_cpu = build_model(cfg), m_sim = build_model(cfg), m_res = build_model(cfg);
  {
    ShardedModel mc(m_cpu, cpu(), 1234, make_local_group(), pol("cpu"));
    ShardedModel md(m_sim, sim(), 1234, make_local_group(), pol("sim"));
    REQUIRE(md.state_on_nvme());
    CHECK(train_steps(mc, 0, K) == train_steps(md, 0, K));
    CHECK(ckpttest::same_state(mc, md));
    save_checkpoint(mc, state_at(K), d + "/cpu");
    save_checkpoint(md, state_at(K), d + "/sim");
    CHECK_NOTHROW(verify_checkpoint(d + "/sim"));
    CHECK(same_files(d + "/cpu", d + "/sim"));
    const auto lc = train_steps(mc, K, N);
    CHECK(lc == train_steps(md, K, N));
    ShardedModel r(m_res, sim(), 99, make_local_group(), pol("resumed"));
    CHECK(load_checkpoint(r, d + "/sim").step == K);
    CHECK(train_steps(r, K, N) == lc);
    CHECK(ckpttest::same_state(mc, r));
    CHECK(same_params(mc, r));
  }
  CHECK(swtest::sim_device_bytes_in_use() == 0);
  fs::remove_all(d);
}

TEST_CASE("device checkpoint: safetensors export and import of a sim model equal the CPU's",
          "[checkpoint][device][export]") {
  const ModelConfig cfg = tiny();
  const std::string d = base_dir() + "/export";
  fs::remove_all(d);
  fs::create_directories(d);
  for (DType pdt : {DType::F32, DType::BF16}) {
    INFO("param_dtype " << dtype_name(pdt));
    const ShardingPolicy pol = policy(pdt);
    Model m_cpu = build_model(cfg), m_sim = build_model(cfg);
    ShardedModel mc(m_cpu, cpu(), 1234, make_local_group(), pol);
    ShardedModel md(m_sim, sim(), 1234, make_local_group(), pol);
    train_steps(mc, 0, 2);
    train_steps(md, 0, 2);
    export_hf_safetensors(mc, d + "/cpu.safetensors");
    export_hf_safetensors(md, d + "/sim.safetensors");
    CHECK(read_file(d + "/cpu.safetensors") == read_file(d + "/sim.safetensors"));
    // Import (set_param uploads) into fresh models on both: the exported weights, and the
    // same training from there.
    Model m2 = build_model(cfg), m3 = build_model(cfg);
    ShardedModel ic(m2, cpu(), 7, make_local_group(), pol);
    ShardedModel is(m3, sim(), 7, make_local_group(), pol);
    import_safetensors(ic, d + "/sim.safetensors");
    import_safetensors(is, d + "/cpu.safetensors");
    CHECK(same_params(mc, ic));
    CHECK(same_params(ic, is));
    CHECK(train_steps(ic, 0, 2) == train_steps(is, 0, 2));
    CHECK(ckpttest::same_state(ic, is));
  }
}

TEST_CASE("device checkpoint: a save of several staging chunks from the sim equals the CPU's",
          "[checkpoint][device]") {
  // ~15 MB of state: the synchronous save streams it through two 8 MiB staging chunks, one
  // device -> host copy per run, with checksum blocks split by the chunk boundary.
  ModelConfig cfg = tiny();
  cfg.vocab_size = 4096;
  cfg.d_model = 192;
  cfg.n_head = 4;
  cfg.n_layer = 1;
  const std::string d = base_dir() + "/big";
  fs::remove_all(d);
  const ShardingPolicy pol = policy(DType::BF16);
  Model m_cpu = build_model(cfg), m_sim = build_model(cfg);
  ShardedModel mc(m_cpu, cpu(), 5, make_local_group(), pol);
  ShardedModel md(m_sim, sim(), 5, make_local_group(), pol);
  train_steps(mc, 0, 1);
  train_steps(md, 0, 1);
  save_checkpoint(mc, state_at(1), d + "/cpu");
  save_checkpoint(md, state_at(1), d + "/sim_sync");
  REQUIRE(fs::file_size(d + "/sim_sync/rank_0.safetensors") > (size_t{8} << 20));
  SnapshotPtr s = snapshot_checkpoint(md, state_at(1));
  write_snapshot(*s, d + "/sim_async.tmp");
  REQUIRE(commit_checkpoint(md.group(), *s, true, d + "/sim_async.tmp", d + "/sim_async"));
  CHECK(same_files(d + "/cpu", d + "/sim_sync"));
  CHECK(same_files(d + "/cpu", d + "/sim_async"));
  Model m2 = build_model(cfg);
  ShardedModel r(m2, sim(), 6, make_local_group(), pol);
  load_checkpoint(r, d + "/sim_sync");
  CHECK(ckpttest::same_state(mc, r));
}
