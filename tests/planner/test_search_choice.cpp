// The search's choice (planner/search.h, issue 42): the tie-break rule on constructed
// candidates (choose_plan), a plan that needs an NVMe directory nobody gave is never chosen and
// the search says which flag would allow it, and `plan --out` fills every path the chosen plan
// needs, so the config it writes loads through train's checks as written.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/temp_dir.h"
#include "core/error.h"
#include "engine/config.h"
#include "planner/hardware.h"
#include "planner/search.h"

using namespace sw;
namespace fs = std::filesystem;

namespace {

// A candidate that fits, with its offloads and a predicted step time.
Evaluated cand(double step_s, OffloadDevice opt, OffloadDevice par, OffloadDevice act,
               bool fits = true, int64_t device = 1000) {
  Evaluated e;
  e.c.optimizer = opt;
  e.c.params = par;
  e.c.activations = act;
  e.time.step_s = step_s;
  e.fits = fits;
  e.device = device;
  return e;
}

constexpr OffloadDevice N = OffloadDevice::None, C = OffloadDevice::Cpu, V = OffloadDevice::Nvme;

// Round figures of a CPU machine: the host tier is the device's memory (no "host" block), the
// disk slower than memory.
HardwareProfile cpu_profile() {
  HardwareProfile hw;
  hw.name = "test cpu";
  hw.gemm_f32 = hw.gemm_bf16 = 5e10;
  hw.elementwise_bps = 1e10;
  hw.optimizer_fps = 1e9;
  hw.has_collectives = true;
  hw.all_gather = hw.reduce_scatter = hw.all_reduce = {2e-5, 5e9, {}};
  hw.disk_read_bps = 1e9;
  hw.disk_write_bps = 5e8;
  hw.disk_latency_s = 1e-4;
  return hw;
}

// The tiny GPT-2 of the tests at 2 ranks, per-rank batch 8, FULL_SHARD.
PlanSetup tiny_setup() {
  PlanSetup s;
  s.model.vocab_size = 256, s.model.n_layer = 4, s.model.n_head = 2, s.model.d_model = 64;
  s.model.seq_len = 64;
  s.world = 2;
  s.micro_batch = 8;
  s.threads = 1;
  return s;
}

// A device budget that only plans with something on NVMe fit, at a host budget of 1 byte:
// halfway between the least device memory of an NVMe plan and of any other.
int64_t nvme_only_budget(const PlanSetup& base, const HardwareProfile& hw) {
  SearchOptions so;
  so.budget = int64_t(1) << 40;
  so.host_budget = 1;
  const int64_t least = search_plans(base, so, hw).smallest.device;
  so.nvme_path = "/tmp/sw_nvme_dir";
  const SearchResult with = search_plans(base, so, hw);
  REQUIRE(tier_use(with.smallest.c).nvme);
  const int64_t least_nvme = with.smallest.device;
  REQUIRE(least_nvme < least);
  return int64_t(double(least_nvme + least) / 2 / (1 - so.margin));
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("tie-break: within the noise, fewer tiers, beyond it, the faster", "[planner]") {
  const double noise = kStepTimeNoise;
  CHECK(noise == 0.01);
  // The issue's case: activations on NVMe 0.6% faster than none (6.884 s against 6.923 s).
  std::vector<Evaluated> ev = {cand(6.884, C, C, V), cand(6.923, C, C, N)};
  CHECK(choose_plan(ev, noise) == 1);
  // 2% apart is beyond the noise: the faster, NVMe and all.
  ev = {cand(1.00, N, N, V), cand(1.02, N, N, N)};
  CHECK(choose_plan(ev, noise) == 0);
  // No NVMe before no host: host activations beat NVMe activations within the noise, even
  // when the NVMe plan offloads fewer things.
  ev = {cand(1.000, N, N, V), cand(1.009, C, C, N)};
  CHECK(choose_plan(ev, noise) == 1);
  // No host over host, then fewer offloaded things: none < one on the host < two on the host.
  ev = {cand(1.000, C, C, N), cand(1.004, C, N, N), cand(1.008, N, N, N)};
  CHECK(choose_plan(ev, noise) == 2);
  ev = {cand(1.000, C, C, N), cand(1.004, C, N, N), cand(1.012, N, N, N)};
  CHECK(choose_plan(ev, noise) == 1);
  ev = {cand(1.000, V, V, V), cand(1.005, V, N, N)};
  CHECK(choose_plan(ev, noise) == 1);
  // The same tiers: the faster (then the smaller device peak).
  ev = {cand(1.004, C, N, N), cand(1.000, N, N, C)};
  CHECK(choose_plan(ev, noise) == 1);
  ev = {cand(1.0, N, N, N, true, 2000), cand(1.0, N, N, N, true, 1500)};
  CHECK(choose_plan(ev, noise) == 1);
  // The window is measured from the fastest that fits: a faster plan that does not fit moves
  // nothing, and neither does a plan with fewer tiers that does not fit.
  ev = {cand(0.5, N, N, N, false), cand(1.000, C, N, N), cand(1.02, C, N, N),
        cand(1.001, N, N, N, false)};
  CHECK(choose_plan(ev, noise) == 1);
  ev = {cand(1.0, N, N, N, false)};
  CHECK(choose_plan(ev, noise) == -1);
  // Noise 0: the fastest, whatever it touches.
  ev = {cand(6.884, C, C, V), cand(6.923, C, C, N)};
  CHECK(choose_plan(ev, 0.0) == 0);
  // The rule as printed.
  const std::string rule = tie_rule(noise);
  CHECK(rule.find("within 1% of the fastest") != std::string::npos);
  CHECK(rule.find("no NVMe over NVMe, no host over host, then fewer offloaded things") !=
        std::string::npos);
  // tier_use counts what leaves the device.
  const TierUse t = tier_use(cand(1, C, V, N).c);
  CHECK(t.host);
  CHECK(t.nvme);
  CHECK(t.offloaded == 2);
}

TEST_CASE("search: NVMe plans need a directory, and every path the chosen plan needs is filled",
          "[planner]") {
  const HardwareProfile hw = cpu_profile();
  const PlanSetup base = tiny_setup();
  // The least device memory without host or NVMe: with a host budget of 1 byte and no NVMe
  // directory, the smallest feasible plan keeps everything on the device.
  SearchOptions so;
  so.budget = int64_t(1) << 40;
  so.host_budget = 1;
  const SearchResult on_device = search_plans(base, so, hw);
  REQUIRE(on_device.best >= 0);
  CHECK(!on_device.frontier[size_t(on_device.best)].needs_nvme_path);
  const int64_t least = on_device.smallest.device;
  CHECK(!tier_use(on_device.smallest.c).nvme);
  // A budget between it and the least an NVMe plan needs: only NVMe plans fit. Without a
  // directory none is chosen, and the search names the plan a directory would allow.
  so.budget = nvme_only_budget(base, hw);
  CHECK(double(least) > double(so.budget) * (1 - so.margin));
  const SearchResult none = search_plans(base, so, hw);
  CHECK(none.best < 0);
  REQUIRE(none.nvme_would_help);
  CHECK(tier_use(none.with_nvme.c).nvme);
  CHECK(none.with_nvme.needs_nvme_path);
  for (const Evaluated& e : none.frontier) CHECK(!tier_use(e.c).nvme);
  // With one: an NVMe plan is chosen and each NVMe key it uses names the directory.
  so.nvme_path = "/tmp/sw_nvme_dir";
  const SearchResult with = search_plans(base, so, hw);
  REQUIRE(with.best >= 0);
  const Evaluated& chosen = with.frontier[size_t(with.best)];
  CHECK(chosen.fits);
  CHECK(tier_use(chosen.c).nvme);
  CHECK(!with.nvme_would_help);
  const ShardingPolicy& p = with.chosen_setup.policy;
  int nvme_keys = 0;
  if (chosen.c.optimizer == OffloadDevice::Nvme) {
    CHECK(p.offload_optimizer.nvme_path == so.nvme_path);
    ++nvme_keys;
  }
  if (chosen.c.params == OffloadDevice::Nvme) {
    CHECK(p.offload_param.nvme_path == so.nvme_path);
    ++nvme_keys;
  }
  if (chosen.c.activations == OffloadDevice::Nvme) {
    CHECK(p.activation_checkpointing.offload_nvme);
    CHECK(p.activation_checkpointing.nvme_path == so.nvme_path);
    ++nvme_keys;
  }
  CHECK(nvme_keys >= 1);
  CHECK_NOTHROW(validate(p, base.world));
  // The config's own directory serves as well as the flag.
  SearchOptions own = so;
  own.nvme_path.clear();
  PlanSetup b2 = base;
  b2.policy.offload_param.nvme_path = "/tmp/sw_config_dir";
  const SearchResult cfg_dir = search_plans(b2, own, hw);
  REQUIRE(cfg_dir.best >= 0);
  CHECK(tier_use(cfg_dir.frontier[size_t(cfg_dir.best)].c).nvme);
  CHECK_NOTHROW(validate(cfg_dir.chosen_setup.policy, base.world));
}

TEST_CASE("plan --out: an NVMe plan's config names the directory in every key it uses",
          "[planner]") {
  swtest::TempDir dir("planner_search_choice");
  {
    std::ofstream f(dir.path / "cfg.json");
    f << R"({"model": {"type": "gpt2", "vocab_size": 256, "n_layer": 4, "n_head": 2,
                       "d_model": 64, "seq_len": 64},
            "data": {"train": "train.bin"}, "train_micro_batch_size_per_gpu": 8,
            "train_steps": 2, "threads": 1, "zero_optimization": {"stage": 3},
            "run_dir": "run"})";
  }
  save_hardware(cpu_profile(), (dir.path / "hw.json").string());
  auto run = [&](const std::string& args) {
    const std::string cmd = "cd '" + dir.path.string() + "' && '" SHARDWISE_BIN "' " + args +
                            " >out.txt 2>err.txt";
    const int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  const std::string budget = std::to_string(nvme_only_budget(tiny_setup(), cpu_profile()));
  const std::string common = "plan cfg.json --world-size 2 --hardware hw.json --memory-budget " +
                             budget + " --host-budget 1";
  // No directory: no plan fits, and the one line says which flag would allow one.
  CHECK(run(common + " --out best.json") != 0);
  const std::string err = slurp(dir.path / "err.txt");
  INFO(err);
  CHECK(err.find("no plan fits a memory budget") != std::string::npos);
  CHECK(err.find("; with --nvme-path DIR, ") != std::string::npos);
  CHECK(err.find(" would fit (device ") != std::string::npos);
  CHECK(!fs::exists(dir.path / "best.json"));
  // A relative directory: written absolute, in every NVMe key the plan uses.
  REQUIRE(run(common + " --nvme-path nv --out best.json") == 0);
  const std::string out = slurp(dir.path / "out.txt");
  INFO(out);
  CHECK(out.find("chosen plan: ") != std::string::npos);
  CHECK(out.find("  rule: among the plans that fit") != std::string::npos);
  const TrainConfig c = load_config((dir.path / "best.json").string(), {}, 2);
  const std::string abs = (dir.path / "nv").string();
  const ShardingPolicy& p = c.sharding;
  int nvme = 0;
  if (p.offload_optimizer.device == OffloadDevice::Nvme) {
    CHECK(p.offload_optimizer.nvme_path == abs);
    ++nvme;
  }
  if (p.offload_param.device == OffloadDevice::Nvme) {
    CHECK(p.offload_param.nvme_path == abs);
    ++nvme;
  }
  if (p.activation_checkpointing.offload_nvme) {
    CHECK(p.activation_checkpointing.nvme_path == abs);
    ++nvme;
  }
  CHECK(nvme >= 1);
  // --json: the chosen plan (NVMe) and the rule.
  REQUIRE(run("plan cfg.json --world-size 2 --hardware hw.json --memory-budget " + budget +
              " --host-budget 1 --nvme-path nv --json") == 0);
  const nlohmann::json j = nlohmann::json::parse(slurp(dir.path / "out.txt"));
  CHECK(j["tie_rule"].get<std::string>() == tie_rule(kStepTimeNoise));
  CHECK(j["best"]["plan"].get<std::string>().find("nvme") != std::string::npos);
}

TEST_CASE("search: the rule changes the real search's choice only within the noise, to fewer tiers",
          "[planner]") {
  // A machine whose host tier is across a link: offloads cost time, so they trade against
  // device memory; a fast disk makes NVMe plans competitive.
  HardwareProfile hw = cpu_profile();
  hw.has_host = true;
  hw.host_link_bps = 1e9;
  hw.host_optimizer_fps = 5e8;
  hw.disk_read_bps = hw.disk_write_bps = 1e10;
  const PlanSetup base = tiny_setup();
  SearchOptions so;
  so.nvme_path = "/tmp/sw_nvme_dir";
  so.budget = int64_t(1) << 40;
  const SearchResult all = search_plans(base, so, hw);
  const int64_t top = all.frontier.back().device, least = all.frontier.front().device;
  auto key = [](const Evaluated& e) {
    const TierUse t = tier_use(e.c);
    return std::make_tuple(t.nvme, t.host, t.offloaded);
  };
  int fewer = 0;
  for (int i = 1; i <= 24; ++i) {
    so.budget = least + (top - least) * i / 24;
    so.noise = 0;  // no window: the fastest plan that fits
    const SearchResult f = search_plans(base, so, hw);
    so.noise = kStepTimeNoise;
    const SearchResult r = search_plans(base, so, hw);
    REQUIRE(f.best >= 0);
    REQUIRE(r.best >= 0);
    const Evaluated &fast = f.frontier[size_t(f.best)], &c = r.frontier[size_t(r.best)];
    INFO("budget " << so.budget << ": chosen " << c.c.describe() << "; fastest "
                   << fast.c.describe());
    CHECK(c.fits);
    CHECK(fast.time.step_s == r.fastest.time.step_s);
    CHECK(c.time.step_s <= fast.time.step_s * (1 + kStepTimeNoise));
    CHECK(key(c) <= key(fast));
    fewer += key(c) < key(fast);
  }
  CHECK(fewer > 0);  // over these budgets the rule took fewer tiers at least once
}
