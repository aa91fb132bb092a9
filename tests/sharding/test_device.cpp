// The engine on a device other than the CPU, checked on the simulated accelerator
// (tests/common/sim_device.h): its memory faults when host code touches it outside the
// device's ops and copies, and its ops are the CPU's, so a model trained on it must give the
// CPU run's numbers bit for bit. That proves that ShardedModel reaches device memory only
// through Ops and copy_bytes (what a CUDA run needs), on a machine without a GPU.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/plan_util.h"
#include "common/settled_step.h"
#include "common/sim_device.h"
#include "common/temp_dir.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"
#include "sharding/wrap.h"

using namespace sw;

namespace {

struct Data {
  std::vector<int32_t> tokens, targets;
  Batch batch;
  Data(int B, int T, uint64_t seed, int V) : tokens(size_t(B) * T), targets(size_t(B) * T) {
    Rng r(seed);
    for (auto& t : tokens) t = static_cast<int32_t>(r.below(static_cast<uint64_t>(V)));
    for (auto& t : targets) t = static_cast<int32_t>(r.below(static_cast<uint64_t>(V)));
    targets[1] = -1;  // an ignored position
    batch = {tokens.data(), targets.data(), B, T};
  }
};

ModelConfig tiny(const std::string& type) {
  ModelConfig cfg;
  cfg.type = type;
  cfg.vocab_size = 64;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_kv_head = type == "llama" ? 2 : 0;
  cfg.d_model = 32;
  cfg.seq_len = 16;
  if (type == "llama") cfg.d_ff = 48;
  return cfg;
}

// ZeRO-Infinity: the master and gradient shards and the moments in NVMe files under `dir`.
void zero_infinity(ShardingPolicy& pol, const std::string& dir) {
  pol.offload_param.device = OffloadDevice::Nvme;
  pol.offload_param.nvme_path = dir;
  pol.offload_optimizer.device = OffloadDevice::Nvme;
  pol.offload_optimizer.nvme_path = dir;
}

// y = x + x W^T with one (C, C) weight read only by its products (ParamSpec::products_only):
// a unit whose fp32 compute copy holds nothing where it keeps a 16-bit copy.
class ProductsOnly final : public Unit {
 public:
  explicit ProductsOnly(int C) : C_(C) {}
  std::string name() const override { return "products_only"; }
  std::vector<ParamSpec> params() const override {
    ParamSpec w;
    w.name = "products_only.weight";
    w.shape = {C_, C_};
    w.std = 0.05f;
    return {product_weight(w)};
  }
  void forward(UnitCtx& ctx, int, const float* x, float* y) override {
    const Ops& ops = *ctx.ops;
    const int N = ctx.batch->B * ctx.batch->T;
    ops.linear_forward(y, x, ctx.weight(0), nullptr, nullptr, N, C_, C_);
    ops.residual_forward(y, y, x, size_t(N) * C_);
  }
  void backward(UnitCtx& ctx, int, const float* x, const float* dy, float* dx) override {
    const Ops& ops = *ctx.ops;
    const int N = ctx.batch->B * ctx.batch->T;
    float* t = ctx.scratch->f32(size_t(N) * C_);
    ops.linear_backward(GradIn::set(t), ctx.grad(0), nullptr, dy, x, ctx.weight(0), N, C_, C_);
    ops.residual_forward(dx, dy, t, size_t(N) * C_);
    ctx.scratch->reset();  // (the models' ScratchScope)
  }
  ActivationDecl declare_activations(int, BatchShape shape) const override {
    ActivationDecl d;
    d.scratch_bwd = Scratch::bytes_for(size_t(shape.B) * shape.T * C_);
    return d;
  }

 private:
  int C_;
};

// The tiny model with a ProductsOnly unit after its first unit.
Model with_products_only(const ModelConfig& cfg) {
  Model m = build_model(cfg);
  m.units.insert(m.units.begin() + 1, std::make_unique<ProductsOnly>(cfg.d_model));
  for (Call& c : m.schedule)
    if (c.unit >= 1) ++c.unit;
  m.schedule.insert(m.schedule.begin() + 1, Call{1, 0});
  return m;
}

struct Run {
  std::vector<double> losses, norms, evals;
  std::map<std::string, std::vector<float>> params;
  std::vector<float> logits;
};

// Twenty optimizer steps (two micro-steps each, clipping), then eval and logits. On the CPU
// each micro-step's loss is read as it ends (forward_backward); on a device the step's losses
// come with the gradient norm (micro_step, step_losses).
Run train(const ModelConfig& cfg, const Ops& ops, const ShardingPolicy& pol, GroupPtr g,
          bool products_only_unit = false, int blocks_per_unit = 1) {
  Model m = products_only_unit ? with_products_only(cfg) : build_model(cfg);
  if (blocks_per_unit > 1) wrap_blocks(m, blocks_per_unit);
  ShardedModel sm(m, ops, 1234, g, pol);
  Data a(2, cfg.seq_len, 7, cfg.vocab_size), b(2, cfg.seq_len, 8, cfg.vocab_size);
  AdamWParams ap;
  Run r;
  for (int step = 1; step <= 20; ++step) {
    sm.zero_grads();
    double norm = 0;
    if (ops.device().is_cpu()) {  // the CPU reads each loss, the device each step's at once
      r.losses.push_back(sm.forward_backward(a.batch, 0.5f, false));
      r.losses.push_back(sm.forward_backward(b.batch, 0.5f, true));
      norm = sm.grad_norm();
    } else {
      sm.micro_step(a.batch, 0.5f, false);
      sm.micro_step(b.batch, 0.5f, true);
      norm = sm.grad_norm();
      for (double l : sm.step_losses()) r.losses.push_back(l);
    }
    r.norms.push_back(norm);
    sm.optimizer_step(ap, 1e-2f, norm > 1.0 ? float(1.0 / norm) : 1.f, step);
  }
  r.evals.push_back(sm.eval_loss(a.batch));
  r.logits.assign(size_t(a.batch.B) * cfg.vocab_size, 0.f);
  Batch nt{a.tokens.data(), nullptr, a.batch.B, a.batch.T};
  sm.logits_last(nt, r.logits.data());
  sm.for_each_param([&](const ParamSpec& s, const float* p) {
    r.params[s.name].assign(p, p + numel(s.shape));
  });
  return r;
}

void check_same(const Run& x, const Run& y) {
  REQUIRE(x.losses.size() == y.losses.size());
  for (size_t i = 0; i < x.losses.size(); ++i) CHECK(x.losses[i] == y.losses[i]);
  for (size_t i = 0; i < x.norms.size(); ++i) CHECK(x.norms[i] == y.norms[i]);
  CHECK(x.evals == y.evals);
  CHECK(x.logits == y.logits);
  REQUIRE(x.params.size() == y.params.size());
  for (const auto& [name, v] : x.params) {
    INFO(name);
    CHECK(v == y.params.at(name));
  }
}

}  // namespace

TEST_CASE("sim device: copies round-trip and a host access faults", "[device]") {
  std::vector<float> h(1000), back(1000);
  for (size_t i = 0; i < h.size(); ++i) h[i] = float(i) * 0.5f;
  Buffer d(h.size() * 4, Mem::Params, Device::sim(0));
  CHECK(swtest::sim_device_owns(d.data()));
  copy_bytes(d.data(), d.device(), h.data(), Device::cpu(), h.size() * 4);
  ops_for(Device::sim(0)).scale(d.f32(), 2.f, h.size());
  copy_bytes(back.data(), Device::cpu(), d.data(), d.device(), h.size() * 4);
  for (size_t i = 0; i < h.size(); ++i) REQUIRE(back[i] == h[i] * 2.f);
  CHECK_FALSE(swtest::sim_device_open());
  // A copy given a host pointer for its device side must fail (exit 88).
  const pid_t pid2 = fork();
  REQUIRE(pid2 >= 0);
  if (pid2 == 0) {
    copy_bytes(back.data(), Device::sim(0), h.data(), Device::cpu(), 16);
    _exit(0);
  }
  int status2 = 0;
  waitpid(pid2, &status2, 0);
  CHECK(WIFEXITED(status2));
  CHECK(WEXITSTATUS(status2) == 88);
  // A direct read from the host must fault (the child dies with the handler's code, 86).
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    volatile float x = *static_cast<volatile float*>(d.f32());
    (void)x;
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 86);
}

TEST_CASE("sim device: ShardedModel trains bit-identically to the CPU", "[device]") {
  // Host updates start late, so a unit touched before its update settled reads stale values.
  setenv("SHARDWISE_HOST_UPDATE_DELAY_US", "2000", 1);
  for (const char* type : {"gpt2", "llama"}) {
    // prec 0: fp32; 1: bf16 parameters, fp32 reductions; 2: both bf16 (one rank rounds its
    // gradients: on the device left to the norm's and the update's reads, FlatUnit::
    // round_grads; on the CPU in place), with the offload cases 0-3.
    for (int prec = 0; prec < 3; ++prec)
    for (int offload = 0; offload < (prec == 2 ? 4 : 7); ++offload) {
      const DType pdt = prec ? DType::BF16 : DType::F32;
      // 0: none; 1: the AdamW moments of half the units on the host (updated on the CPU);
      // 2: activations kept for backward moved to the host between forward and backward;
      // 3: parameter and gradient shards and moments on the host (ZeRO-Offload);
      // 4: the moments of half the units in an NVMe file, in pieces (updated on the CPU);
      // 5: activations kept for backward written to an NVMe file and read back;
      // 6: master and gradient shards and moments in NVMe files (ZeRO-Infinity).
      INFO(type << " param_dtype " << dtype_name(pdt) << " reduce_dtype "
                << (prec == 2 ? "bf16" : "fp32") << " offload case " << offload);
      const ModelConfig cfg = tiny(type);
      ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
      pol.mixed_precision.param_dtype = pdt;
      if (prec == 2) pol.mixed_precision.reduce_dtype = DType::BF16;
      pol.activation_checkpointing.mode = CheckpointMode::Full;  // recompute too
      pol.activation_checkpointing.every = 2;
      if (offload == 1) {
        pol.offload_optimizer.device = OffloadDevice::Cpu;
        pol.offload_optimizer.ratio = 0.5;
      }
      if (offload == 2) pol.activation_checkpointing.offload_cpu = true;
      if (offload == 3) {
        pol.offload_param.device = OffloadDevice::Cpu;
        pol.offload_optimizer.device = OffloadDevice::Cpu;
      }
      swtest::TempDir dir("device_nvme");
      if (offload == 4) {
        pol.offload_optimizer.device = OffloadDevice::Nvme;
        pol.offload_optimizer.nvme_path = dir.path.string();
        pol.offload_optimizer.ratio = 0.5;
        pol.offload_optimizer.piece_floats = 1000;
      }
      if (offload == 6) {
        zero_infinity(pol, dir.path.string());
        pol.offload_optimizer.piece_floats = 1000;
      }
      if (offload == 5) {
        pol.activation_checkpointing.offload_nvme = true;
        pol.activation_checkpointing.nvme_path = dir.path.string();
      }
      const Run cpu = train(cfg, ops_for(Device::cpu()), pol, make_local_group());
      const Run dev =
          train(cfg, ops_for(Device::sim(0)), pol, make_local_group());
      check_same(cpu, dev);
      CHECK(swtest::sim_device_bytes_in_use() == 0);
    }
  }
  unsetenv("SHARDWISE_HOST_UPDATE_DELAY_US");
}

TEST_CASE("sim device: composite units hand the residual gradient's 16-bit form from block to block",
          "[device]") {
  // Blocks 0-1 in one composite unit, block 2 alone (sharding/wrap.h), bf16 products: in
  // backward each block's last norm leaves narrow(dx) beside dx (UnitCtx::grad16), which the
  // next block's first product reads on the device (as CUDA does) instead of narrowing dx. The
  // CPU narrows in each product: the same values, so a stale or missing 16-bit form anywhere
  // in the chain changes the device's numbers. (Both wrapped alike: the gradient norm sums per
  // unit.)
  for (const char* type : {"gpt2", "llama"}) {
    INFO(type);
    ModelConfig cfg = tiny(type);
    cfg.n_layer = 3;
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    pol.mixed_precision.param_dtype = DType::BF16;
    const Run cpu = train(cfg, ops_for(Device::cpu()), pol, make_local_group(), false, 2);
    const Run dev = train(cfg, ops_for(Device::sim(0)), pol, make_local_group(), false, 2);
    check_same(cpu, dev);
    CHECK(swtest::sim_device_bytes_in_use() == 0);
  }
}

TEST_CASE("sim device: units' 16-bit weight copies are the memory the plan counts", "[device]") {
  // bf16 on a device: each unit keeps a 16-bit copy of its parameters beside the fp32 ones
  // (sharding/unit_state.h): persistent Params for a whole unit (one rank), transient
  // Communication with the gathered buffer for a sharded one (one rank with its parameters in
  // NVMe files takes the sharded path). The tracked bytes are the plan's, and the copy is 2
  // bytes a padded parameter (against the same model in fp32 params, which keeps none), while
  // the weights read only by matrix products (ParamSpec::products_only) lose their fp32
  // compute copy: 4 bytes each.
  swtest::TempDir dir("device_w16");
  for (const char* type : {"gpt2", "llama"})
    for (int sharded = 0; sharded < 2; ++sharded) {
      int64_t params[2] = {}, comm[2] = {}, padded = 0, lp_only = 0;
      for (int k = 0; k < 2; ++k) {
        const DType pdt = k ? DType::BF16 : DType::F32;
        INFO(type << (sharded ? " sharded (NVMe parameters) " : " whole ") << dtype_name(pdt));
        const ModelConfig cfg = tiny(type);
        ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
        pol.mixed_precision.param_dtype = pdt;
        if (sharded) {
          zero_infinity(pol, dir.path.string());
        }
        MemTracker& mt = MemTracker::global();
        const size_t p0 = mt.current(Mem::Params);
        Model m = build_model(cfg);
        ShardedModel sm(m, ops_for(Device::sim(0)), 3, make_local_group(), pol);
        params[k] = int64_t(mt.current(Mem::Params) - p0);
        Data a(2, cfg.seq_len, 11, cfg.vocab_size);
        sm.forward_backward(a.batch);  // warm-up, ending like a step
        sm.optimizer_step(AdamWParams{}, 1e-3f, 1.f, 1);
        sm.zero_grads();
        const StepPlan plan = sm.step_plan(2, cfg.seq_len, 1);
        if (!sharded) CHECK(params[k] == plan.persistent[size_t(Mem::Params)]);
        const int64_t c0 = int64_t(mt.current(Mem::Communication));
        mt.reset_peaks();
        sm.forward_backward(a.batch);
        comm[k] = int64_t(mt.peak(Mem::Communication)) - c0 +
                  plan.initial[size_t(Mem::Communication)];
        CHECK(comm[k] == swtest::replay(plan).peak[size_t(Mem::Communication)]);
        padded = lp_only = 0;
        for (int u = 0; u < sm.num_units(); ++u) {
          const FlatLayout& L = sm.unit_layout(u);
          padded += L.padded;
          lp_only += L.lp_only();
          // The compact fp32 buffer holds the other parameters (their aligned sizes, and at
          // most the padding of the unit beside them).
          int64_t f32 = 0, all = 0;
          for (size_t s = 0; s < L.specs.size(); ++s) {
            const int64_t a = (L.entries[s].numel + kAlign - 1) / kAlign * kAlign;
            all += a;
            if (!L.specs[s].products_only) f32 += a;
          }
          CHECK(L.padded - L.lp_only() >= f32);
          CHECK(L.padded - L.lp_only() <= std::max(f32, kAlign) + (L.padded - all));
        }
      }
      INFO(type << (sharded ? " sharded" : " whole"));
      // Most of GPT-2's and the Llama's block parameters are product weights.
      CHECK(lp_only > padded / 2);
      if (sharded) {  // each gathered unit's buffers: under 4 bytes a parameter now
        CHECK(comm[1] < comm[0]);
      } else {  // the split master + the copy - the product weights' fp32 copy
        CHECK(params[1] - params[0] == 4 * padded + 2 * padded - 4 * lp_only);
        CHECK(comm[1] == comm[0]);
      }
    }
  CHECK(swtest::sim_device_bytes_in_use() == 0);
}

TEST_CASE("sim device: a unit of product weights only trains bit-identically to the CPU",
          "[device]") {
  // Its fp32 compute copy keeps one aligned block and nothing of its weight (FlatLayout::
  // compact): the products read the 16-bit copy, kind C's update writes it, kind A's gather
  // widens nothing (one rank with NVMe parameters takes the sharded path).
  swtest::TempDir dir("device_products_only");
  for (int sharded = 0; sharded < 2; ++sharded) {
    INFO((sharded ? "sharded (NVMe parameters)" : "whole"));
    const ModelConfig cfg = tiny("gpt2");
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    pol.mixed_precision.param_dtype = DType::BF16;
    if (sharded) {
      zero_infinity(pol, dir.path.string());
    }
    {
      Model m = with_products_only(cfg);
      ShardedModel sm(m, ops_for(Device::sim(0)), 1, make_local_group(), pol);
      const FlatLayout& L = sm.unit_layout(1);
      CHECK((L.compact == kAlign && L.lp_only() == L.padded - kAlign));
    }
    const Run cpu = train(cfg, ops_for(Device::cpu()), pol, make_local_group(), true);
    const Run dev = train(cfg, ops_for(Device::sim(0)), pol, make_local_group(), true);
    REQUIRE(cpu.params.count("products_only.weight"));
    check_same(cpu, dev);
    CHECK(swtest::sim_device_bytes_in_use() == 0);
  }
}

TEST_CASE("sim device: asynchronous copies run in order, only once waited for", "[device]") {
  // Host sides in Tier::Host (pinned: the sim records the pinning a GPU backend would do).
  const size_t n = 256;
  Buffer hb(n * 4, Mem::Params, Device::cpu(), Tier::Host);
  Buffer backb(n * 4, Mem::Params, Device::cpu(), Tier::Host);
  Buffer back2b(n * 4, Mem::Params, Device::cpu(), Tier::Host);
  float* h = hb.f32();
  float* back = backb.f32();
  float* back2 = back2b.f32();
  for (size_t i = 0; i < n; ++i) h[i] = float(i) + 0.25f, back[i] = back2[i] = -1.f;
  Buffer d(n * 4, Mem::Params, Device::sim(0));
  const uint64_t issued = swtest::sim_copies_issued(), done = swtest::sim_copies_done();
  const uint64_t syncs = swtest::sim_host_syncs(), unpinned = swtest::sim_unpinned_copies();
  auto up = copy_bytes_async(d.data(), d.device(), h, Device::cpu(), n * 4);
  auto down = copy_bytes_async(back, Device::cpu(), d.data(), d.device(), n * 4, up.get());
  // Waiting for the upload at issue of the download ran it; the download is still queued.
  CHECK(swtest::sim_copies_issued() == issued + 2);
  CHECK(swtest::sim_copies_done() == done + 1);
  CHECK(back[0] == -1.f);
  // A later download of the same lane runs the earlier one first.
  auto down2 = copy_bytes_async(back2, Device::cpu(), d.data(), d.device(), 64);
  down2->synchronize();
  CHECK(down->query());
  CHECK(std::equal(back, back + n, h));
  CHECK(back2[15] == h[15]);
  CHECK(back2[16] == -1.f);
  CHECK(swtest::sim_unpinned_copies() == unpinned);
  CHECK(swtest::sim_host_syncs() == syncs + 2);  // the wait at issue and down2's
  // Pageable host memory (a std::vector): the copy runs at once, as cudaMemcpyAsync's does,
  // and counts as a synchronisation.
  std::vector<float> pageable(n, -1.f);
  auto down3 = copy_bytes_async(pageable.data(), Device::cpu(), d.data(), d.device(), n * 4);
  CHECK(pageable[n - 1] == h[n - 1]);
  CHECK(swtest::sim_unpinned_copies() == unpinned + 1);
  CHECK(swtest::sim_host_syncs() == syncs + 3);
  // Between host buffers: a memcpy, complete on return.
  std::vector<float> h2(4, 0.f);
  CHECK(copy_bytes_async(h2.data(), Device::cpu(), h, Device::cpu(), 16)->query());
  CHECK(h2[3] == h[3]);
  CHECK_FALSE(swtest::sim_device_open());
}

TEST_CASE("sim device: the host optimizer runs on its thread while the device goes on",
          "[device]") {
  // offload_optimizer cpu: optimizer_step leaves the offloaded updates to the host updater and
  // returns; zero_grads does not wait for them; each unit waits for its own update where it is
  // next touched. Held updates prove that the step returned before any ran; the run must
  // still equal the CPU's bit for bit.
  for (DType pdt : {DType::F32, DType::BF16}) {
    INFO("param_dtype " << dtype_name(pdt));
    const ModelConfig cfg = tiny("llama");
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    pol.mixed_precision.param_dtype = pdt;
    pol.forward_prefetch = 0;  // the optimizer segment then touches no unit after its update
    pol.offload_optimizer.device = OffloadDevice::Cpu;
    auto run = [&](const Ops& ops, GroupPtr g, bool hold) {
      Model m = build_model(cfg);
      ShardedModel sm(m, ops, 99, g, pol);
      Data a(2, cfg.seq_len, 3, cfg.vocab_size);
      AdamWParams ap;
      std::vector<double> losses;
      int held = -1;
      for (int step = 1; step <= 6; ++step) {
        sm.zero_grads();
        losses.push_back(sm.forward_backward(a.batch, 1.f, true));
        if (hold && step == 3) sm.hold_host_updates(true);
        sm.optimizer_step(ap, 1e-2f, 1.f, step);
        if (hold && step == 3) {
          held = sm.host_updates_in_flight();
          sm.zero_grads();  // deferred, not waited for
          CHECK(sm.host_updates_in_flight() == held);
          sm.hold_host_updates(false);
        }
      }
      losses.push_back(sm.eval_loss(a.batch));
      CHECK(sm.host_updates_in_flight() == 0);  // eval touched every unit
      return std::make_pair(losses, held);
    };
    setenv("SHARDWISE_HOST_UPDATE_DELAY_US", "2000", 1);
    const auto cpu = run(ops_for(Device::cpu()), make_local_group(), false);
    const auto dev = run(ops_for(Device::sim(0)), make_local_group(),
                         true);
    unsetenv("SHARDWISE_HOST_UPDATE_DELAY_US");
    Model m = build_model(cfg);
    CHECK(dev.second == static_cast<int>(m.units.size()));
    CHECK(cpu.first == dev.first);
    CHECK(swtest::sim_device_bytes_in_use() == 0);
  }
}

TEST_CASE("sim device: activation offload on copy streams runs its plan, to the byte", "[device]") {
  // On a device the copies to and from the host tier are asynchronous: an evicted call's
  // device bytes are freed once a WaitIo after the next call's forward sees its copy done, and
  // its fetch is issued one call ahead (as offload to a file does, which on a device goes
  // through host copies). The executor runs exactly that plan, and the measured activation
  // peak is the plan's.
  for (const char* type : {"gpt2", "llama"}) {
    INFO(type);
    const ModelConfig cfg = tiny(type);
    ShardingPolicy base = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    swtest::TempDir dir("device_acts");
    int64_t peak[3];
    for (int k = 0; k < 3; ++k) {
      INFO("offload " << (k == 0 ? "none" : k == 1 ? "cpu" : "nvme"));
      ShardingPolicy off = base;
      off.activation_checkpointing.offload_cpu = k == 1;
      off.activation_checkpointing.offload_nvme = k == 2;
      off.activation_checkpointing.nvme_path = dir.path.string();
      Model m = build_model(cfg);
      ShardedModel sm(m, ops_for(Device::sim(0)), 3, make_local_group(),
                      off);
      Data a(2, cfg.seq_len, 11, cfg.vocab_size);
      sm.forward_backward(a.batch);  // warm-up, ending like a step
      sm.optimizer_step(AdamWParams{}, 1e-3f, 1.f, 1);
      sm.zero_grads();
      const StepPlan plan = sm.step_plan(2, cfg.seq_len, 1);
      int evicts = 0, freed_at_wait = 0;
      for (const Action& x : plan.actions) {
        evicts += x.kind == ActionKind::EvictActs;
        freed_at_wait += x.kind == ActionKind::WaitActs && x.mem[size_t(Mem::Activations)] < 0;
      }
      CHECK(evicts == (k ? freed_at_wait : 0));
      if (k) CHECK(evicts > 0);
      StepRecorder rec;
      MemTracker& mt = MemTracker::global();
      const size_t a0 = mt.current(Mem::Activations);
      mt.reset_peaks();
      sm.set_recorder(&rec);
      sm.forward_backward(a.batch);
      sm.set_recorder(nullptr);
      std::vector<std::string> planned = swtest::planned_actions(plan);
      planned.resize(swtest::executed_actions(rec).size());  // the micro-step only
      CHECK(swtest::executed_actions(rec) == planned);
      CHECK(mt.current(Mem::Activations) == a0);
      peak[k] = int64_t(mt.peak(Mem::Activations) - a0);
      CHECK(peak[k] == swtest::replay(plan).peak[size_t(Mem::Activations)]);
    }
    CHECK(peak[1] < peak[0]);
    CHECK(peak[2] < peak[0]);
  }
  CHECK(swtest::sim_device_bytes_in_use() == 0);
}

TEST_CASE("sim device: NVMe staging is host memory, as the plan counts it", "[device]") {
  swtest::TempDir dir("device_staging");
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  zero_infinity(p, dir.path.string());
  p.offload_optimizer.piece_floats = 1000;
  const ModelConfig cfg = tiny("llama");
  Model m = build_model(cfg);
  MemTracker& host = MemTracker::of(Tier::Host);
  MemTracker& dev = MemTracker::global();
  const Mem cats[] = {Mem::Params, Mem::Grads, Mem::Optimizer};
  size_t h0[3], d0[3];
  for (int c = 0; c < 3; ++c) h0[c] = host.current(cats[c]), d0[c] = dev.current(cats[c]);
  ShardedModel sm(m, ops_for(Device::sim(0)), 5, make_local_group(), p);
  const StepPlan plan = sm.step_plan(2, cfg.seq_len, 1);
  for (int c = 0; c < 3; ++c) {
    INFO(mem_name(cats[c]));
    CHECK(plan.persistent_host[size_t(cats[c])] > 0);
    CHECK(int64_t(host.current(cats[c]) - h0[c]) == plan.persistent_host[size_t(cats[c])]);
    CHECK(int64_t(dev.current(cats[c]) - d0[c]) == plan.persistent[size_t(cats[c])]);
  }
}

TEST_CASE("sim device: the host updater stages two updates at most, as the plan counts",
          "[device]") {
  // offload_optimizer cpu: each update's master and gradients are copied down into host
  // staging by the updater thread (its own and the next one's), not all at issue. Updates held
  // until the whole optimizer segment is issued must still never stage more than the plan's
  // host_update_staging, which is well below staging every unit at once.
  for (const char* type : {"gpt2", "llama"}) {
    INFO(type);
    ModelConfig cfg = tiny(type);
    cfg.n_layer = 4;
    ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    p.offload_optimizer.device = OffloadDevice::Cpu;
    Model m = build_model(cfg);
    MemTracker& host = MemTracker::of(Tier::Host);
    const size_t o0 = host.current(Mem::Optimizer);
    ShardedModel sm(m, ops_for(Device::sim(0)), 5, make_local_group(), p);
    const StepPlan plan = sm.step_plan(2, cfg.seq_len, 1);
    const int64_t moments = plan.persistent_host[size_t(Mem::Optimizer)];
    CHECK(int64_t(host.current(Mem::Optimizer) - o0) == moments);
    REQUIRE(plan.host_update_staging > 0);
    CHECK(host_bytes(plan) == moments + plan.host_update_staging);
    CHECK(plan.host_update_staging < moments);  // staging every unit at once: 8 B per parameter
    Data a(2, cfg.seq_len, 7, cfg.vocab_size);
    for (int step = 1; step <= 3; ++step) {
      sm.zero_grads();
      sm.micro_step(a.batch);
      const double norm = sm.grad_norm();
      host.reset_peaks();
      sm.hold_host_updates(true);
      sm.optimizer_step(AdamWParams{}, 1e-2f, norm > 1.0 ? float(1.0 / norm) : 1.f, step);
      CHECK(sm.host_updates_in_flight() == sm.num_units());
      sm.hold_host_updates(false);
      sm.step_losses();
      sm.zero_grads();
      sm.micro_step(a.batch);  // waits for each unit's update where it is touched
      CHECK(sm.host_updates_in_flight() == 0);
      const int64_t staged = int64_t(host.peak(Mem::Optimizer) - o0) - moments;
      CHECK(staged > 0);
      CHECK(staged <= plan.host_update_staging);
      sm.step_losses();
    }
  }
  CHECK(swtest::sim_device_bytes_in_use() == 0);
}

TEST_CASE("sim device: the recorder shows each host update as it ran on the updater thread",
          "[device]") {
  // offload_optimizer cpu, updates held while the optimizer segment is issued: each offloaded
  // unit gets one Queue::Host record, which starts after its issue (the compute queue's
  // optimizer_update record) and is moved into the recorder by the segment it overlapped.
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  p.offload_optimizer.device = OffloadDevice::Cpu;
  const ModelConfig cfg = tiny("gpt2");
  Model m = build_model(cfg);
  ShardedModel sm(m, ops_for(Device::sim(0)), 5, make_local_group(), p);
  Data a(2, cfg.seq_len, 7, cfg.vocab_size);
  StepRecorder rec;
  sm.set_recorder(&rec);
  sm.micro_step(a.batch);
  sm.hold_host_updates(true);
  sm.optimizer_step(AdamWParams{}, 1e-2f, 1.f, 1);
  const double released = trace_clock();
  sm.hold_host_updates(false);
  sm.zero_grads();
  sm.micro_step(a.batch);  // waits for each update where its unit is touched
  sm.set_recorder(nullptr);
  std::map<int, double> issued;  // unit -> the end
  std::map<int, int> host;       // unit -> host records
  for (const ActionRecord& r : rec.records) {
    if (r.kind != ActionKind::OptimizerUpdate) continue;
    if (r.queue == Queue::Compute) issued[r.unit] = r.t_end;
    if (r.queue != Queue::Host) continue;
    ++host[r.unit];
    CHECK(r.action == -1);
    CHECK(r.segment == 2);  // the micro-step after the optimizer
    CHECK(r.t_begin >= released);
    CHECK(r.t_end >= r.t_begin);
    CHECK(r.bytes > 0);
  }
  CHECK(int(issued.size()) == sm.num_units());
  CHECK(int(host.size()) == sm.num_units());
  for (const auto& [u, n] : host) {
    CHECK(n == 1);
    CHECK(issued.count(u) == 1);
  }
  CHECK(std::string(queue_name(Queue::Host)) == "host");
}

TEST_CASE("sim device: offload a device cannot do is refused with the key named", "[device]") {
  Model m = build_model(tiny("gpt2"));
  const Ops& sim = ops_for(Device::sim(0));
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  zero_infinity(p, "/tmp");
  p.offload_optimizer.ratio = 0.5;  // some units' moments on the device, their shards not
  CHECK_THROWS_WITH(ShardedModel(m, sim, 1, make_local_group(), p),
                    Catch::Contains("offload_param 'nvme' with device sim:0 needs offload_optimizer "
                                    "'cpu' or 'nvme' with ratio 1"));
  // A device group given as the model's group: its host scalars and staging would go through
  // device memory twice. ShardedModel makes its device groups from the host group itself.
  CHECK_THROWS_WITH(ShardedModel(m, sim, 1, device_group(make_local_group(), Device::sim(0)),
                                 ShardingPolicy::for_strategy(ShardingStrategy::FullShard)),
                    Catch::Contains("needs the host group (local or mpi), got a 'staged' group"));
  p = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  p.offload_param.device = OffloadDevice::Cpu;
  CHECK_THROWS_WITH(ShardedModel(m, sim, 1, make_local_group(), p),
                    Catch::Contains("offload_param 'cpu' with device sim:0 needs offload_optimizer"));
  CHECK(swtest::sim_device_bytes_in_use() == 0);
}

TEST_CASE("sim device: a training step synchronises the host with the device once", "[device]") {
  // Micro-steps leave their losses on the device; grad_norm's one read brings them back with
  // the norm's sums; the optimizer (on the device, or on the host updater thread) and the next
  // step's uploads wait only on the device's streams. Every offload tier that works through
  // copy streams keeps that, activations in an NVMe file too (their writes wait for the
  // download in the io stream, not on the host); NVMe staging of shards and moments still
  // copies synchronously.
  for (const char* type : {"gpt2", "llama"})
    for (int offload = 0; offload < 6; ++offload) {
      // 0: none; 1: moments on the host; 2: activations to the host; 3: shards on the host;
      // 4: activations to an NVMe file; 5: shards and moments in NVMe files (ZeRO-Infinity):
      // the gathers' uploads from the staging slots are asynchronous (the next read into a
      // slot waits for its upload in the io queue), but the host still adds each unit's
      // reduced gradients into its staged shard after a synchronous download: at most one
      // synchronisation per unit and micro-step (tiny GPT-2, 3 units: 3; before the uploads
      // were asynchronous, 8).
      INFO(type << " offload case " << offload);
      swtest::TempDir dir("device_syncs");
      const ModelConfig cfg = tiny(type);
      ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
      pol.mixed_precision.param_dtype = DType::BF16;
      pol.activation_checkpointing.mode = CheckpointMode::Full;
      pol.activation_checkpointing.every = 2;
      if (offload == 1) pol.offload_optimizer.device = OffloadDevice::Cpu;
      if (offload == 2) pol.activation_checkpointing.offload_cpu = true;
      if (offload == 3) {
        pol.offload_param.device = OffloadDevice::Cpu;
        pol.offload_optimizer.device = OffloadDevice::Cpu;
      }
      if (offload == 4) {
        pol.activation_checkpointing.offload_nvme = true;
        pol.activation_checkpointing.nvme_path = dir.path.string();
      }
      if (offload == 5) {
        zero_infinity(pol, dir.path.string());
      }
      Model m = build_model(cfg);
      ShardedModel sm(m, ops_for(Device::sim(0)), 1234, make_local_group(), pol);
      Data a(2, cfg.seq_len, 7, cfg.vocab_size), b(2, cfg.seq_len, 8, cfg.vocab_size);
      const uint64_t u0 = swtest::sim_unpinned_copies();
      const uint64_t per_micro = offload == 5 ? m.units.size() : 0;  // at most
      for (int step = 1; step <= 3; ++step) {
        const uint64_t s0 = swtest::sim_host_syncs();
        sm.zero_grads();
        sm.micro_step(a.batch, 0.5f, false);
        sm.micro_step(b.batch, 0.5f, true);
        const uint64_t micro = swtest::sim_host_syncs() - s0;
        INFO("synchronisations in two micro-steps: " << micro);
        if (offload == 5)
          CHECK(micro <= 2 * per_micro);
        else
          CHECK(micro == 0);  // nothing read yet
        const double norm = sm.grad_norm();
        const std::vector<double> losses = sm.step_losses();
        sm.optimizer_step(AdamWParams{}, 1e-2f, norm > 1.0 ? float(1.0 / norm) : 1.f, step);
        CHECK(swtest::sim_host_syncs() == s0 + micro + 1);
        CHECK(swtest::sim_unpinned_copies() == u0);  // (each would be a synchronisation)
        REQUIRE(losses.size() == 2);
        CHECK(std::isfinite(losses[0]));
        CHECK(losses[0] != losses[1]);
      }
      // Without grad_norm, step_losses reads them (once).
      const uint64_t s0 = swtest::sim_host_syncs();
      sm.micro_step(a.batch, 0.5f, true);
      const uint64_t micro = swtest::sim_host_syncs() - s0;
      CHECK(micro <= per_micro);
      CHECK(sm.step_losses().size() == 1);
      CHECK(swtest::sim_host_syncs() == s0 + micro + 1);
      CHECK(sm.step_losses().empty());
      CHECK(swtest::sim_host_syncs() == s0 + micro + 1);
    }
}

TEST_CASE("sim device: an evaluation synchronises the host with the device once", "[device]") {
  // eval_step leaves each batch's loss on the device; eval_losses reads them in one copy (and
  // every 64 batches, when the slots are full). The values equal eval_loss's, batch by batch,
  // and the CPU's bit for bit (the sim computes as the CPU does).
  for (const char* type : {"gpt2", "llama"}) {
    INFO(type);
    const ModelConfig cfg = tiny(type);
    const ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    Model m = build_model(cfg), mc = build_model(cfg);
    ShardedModel sm(m, ops_for(Device::sim(0)), 77, make_local_group(), pol);
    ShardedModel cpu(mc, ops_for(Device::cpu()), 77, make_local_group(), pol);
    std::vector<Data> data;
    for (int i = 0; i < 5; ++i) data.emplace_back(2, cfg.seq_len, 100 + i, cfg.vocab_size);
    const uint64_t s0 = swtest::sim_host_syncs();
    for (const Data& d : data) sm.eval_step(d.batch);
    CHECK(swtest::sim_host_syncs() == s0);  // nothing read yet
    const std::vector<double> got = sm.eval_losses();
    CHECK(swtest::sim_host_syncs() == s0 + 1);
    CHECK(sm.eval_losses().empty());
    CHECK(swtest::sim_host_syncs() == s0 + 1);
    REQUIRE(got.size() == data.size());
    for (size_t i = 0; i < data.size(); ++i) {
      CHECK(got[i] == cpu.eval_loss(data[i].batch));
      CHECK(got[i] == sm.eval_loss(data[i].batch));
    }
    CHECK(got[0] != got[1]);
    // More batches than slots: one read per 64, the results in order.
    const uint64_t s1 = swtest::sim_host_syncs();
    for (int i = 0; i < 70; ++i) sm.eval_step(data[size_t(i) % data.size()].batch);
    const std::vector<double> many = sm.eval_losses();
    CHECK(swtest::sim_host_syncs() == s1 + 2);
    REQUIRE(many.size() == 70);
    for (size_t i = 0; i < many.size(); ++i) CHECK(many[i] == got[i % data.size()]);
  }
}

TEST_CASE("sim device: timed events of any of its streams time against each other, nothing else",
          "[device]") {
  // As cudaEventElapsedTime: two timed events of the device, whatever stream recorded them (a
  // copy stream's against the compute stream's), on the device's clock; an untimed event or the
  // host's stamped one cannot be timed against them. A copy's events are stamped when its lane
  // runs it, lazily: after the compute stream's event recorded once it was issued.
  const size_t n = 256;
  Buffer hb(n * 4, Mem::Params, Device::cpu(), Tier::Host);
  Buffer d(n * 4, Mem::Params, Device::sim(0));
  Stream& s = ops_for(Device::sim(0)).stream();
  const std::shared_ptr<Event> untimed =
      copy_bytes_async(d.data(), d.device(), hb.data(), Device::cpu(), n * 4);
  CHECK(untimed->timed_span().begin == nullptr);  // issued while nobody asked for timing
  untimed->synchronize();
  hold_stream_timing(true);
  const std::shared_ptr<Event> ref = s.record_timed();
  const uint64_t done = swtest::sim_copies_done();
  const std::shared_ptr<Event> down =
      copy_bytes_async(hb.data(), Device::cpu(), d.data(), d.device(), n * 4);
  hold_stream_timing(false);
  const std::shared_ptr<Event> mid = s.record_timed();
  const Event::TimedSpan t = down->timed_span();
  REQUIRE(t.begin != nullptr);
  REQUIRE(t.end != nullptr);
  CHECK(std::string(t.stream) == "sim copy d2h");
  CHECK(swtest::sim_copies_done() == done);  // not run yet
  const double b = t.begin->elapsed_since(*ref), e = t.end->elapsed_since(*ref);
  CHECK(swtest::sim_copies_done() == done + 1);  // timing it ran it
  CHECK(b >= mid->elapsed_since(*ref));
  CHECK(e >= b);
  CHECK(t.end->elapsed_since(*t.begin) == e - b);
  StampedEvent host;
  CHECK_THROWS_AS(t.end->elapsed_since(host), Error);
  CHECK_THROWS_AS(ref->elapsed_since(host), Error);
  CHECK_THROWS_AS(host.elapsed_since(*ref), Error);
  CHECK_THROWS_AS(t.end->elapsed_since(*s.record()), Error);
}

TEST_CASE("sim device: the recorder gives each copy and compute action its own stream's interval",
          "[device]") {
  // With device times (SHARDWISE_PROFILE_DEVICE_TIMES=1 on the sim; a GPU's are always timed)
  // settle_recorder() gives every action whose work ran on a stream of its own that stream's
  // interval and name: an activation copy's on its copy lane (which runs a copy only once it is
  // waited for or queried: after the action that issued it returned), a compute action's on
  // the compute stream (around its host times); all inside the recorded step, through the
  // clock tie (the sim's device clock is not the host's). One rank has no collectives: the
  // gathers and reductions are test_device_mpi's.
  setenv("SHARDWISE_PROFILE_DEVICE_TIMES", "1", 1);
  const ModelConfig cfg = tiny("gpt2");
  ShardingPolicy p = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  p.activation_checkpointing.offload_cpu = true;
  Model m = build_model(cfg);
  ShardedModel sm(m, ops_for(Device::sim(0)), 3, make_local_group(), p);
  Data a(2, cfg.seq_len, 11, cfg.vocab_size);
  sm.forward_backward(a.batch);  // warm-up
  sm.optimizer_step(AdamWParams{}, 1e-3f, 1.f, 1);
  sm.zero_grads();
  const auto [host, settled, before, after] = swtest::record_settled_step(sm, a.batch, 2);
  unsetenv("SHARDWISE_PROFILE_DEVICE_TIMES");
  constexpr double kTie = swtest::kSimClockTie;
  std::map<std::string, int> on;  // "<kind> on <stream>" -> records
  for (size_t i = 0; i < host.size(); ++i) {
    const ActionRecord &h = host[i], &d = settled[i];
    const std::string kind = action_kind_name(d.kind);
    INFO("record " << i << " " << kind << " (" << queue_name(d.queue) << "): host " << h.t_begin
                   << ".." << h.t_end << ", settled " << d.t_begin << ".." << d.t_end << " on "
                   << (d.stream ? d.stream : "-"));
    CHECK(h.stream == nullptr);
    CHECK(d.t_begin >= before);
    CHECK(d.t_end <= after + kTie);
    CHECK(d.t_begin <= d.t_end);
    if (!d.stream) {  // the host's times: no work of its own on a device stream
      CHECK(d.queue != Queue::Compute);
      CHECK((d.queue == Queue::Host || d.kind == ActionKind::WaitReduce));
      continue;
    }
    ++on[kind + " on " + d.stream];
    if (!swtest::check_sim_stream_record(host, settled, i)) {  // a compute action
      CHECK(d.queue == Queue::Compute);
      CHECK(std::string(d.stream) == "sim");
      CHECK(d.t_begin <= h.t_begin + kTie);
      CHECK(d.t_end >= h.t_end);
    }
  }
  for (const auto& [k, n] : on) INFO(k << ": " << n);
  int updates = 0;
  for (const ActionRecord& h : host) updates += h.kind == ActionKind::OptimizerUpdate;
  CHECK(on["evict_acts on sim copy d2h"] > 0);
  CHECK(on["fetch_acts on sim copy h2d"] == on["evict_acts on sim copy d2h"]);
  CHECK(on["forward on sim"] > 0);
  CHECK(on["optimizer_update on sim"] == updates);
  CHECK(updates > 0);
}
