// `shardwise plan-dump CONFIG [--world-size N] [--eval] [--set k=v]...`: builds the model the
// config describes (no parameters are allocated) and prints the StepPlan that a run of N ranks
// executes each step (sharding/step_plan.h): every action with its queue, unit, bytes moved,
// memory allocated or freed per category and the actions it waits for. `shardwise plan`:
// that plan replayed (peaks per tier, step time), the search under a budget, --calibrate.
// Each command runs on a parsed PlanArgs; add_plan_commands (at the end) declares the options.
#include "tools/plan_cmd.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/bytes.h"
#include "core/error.h"
#include "kernels/threads.h"
#include "planner/calibrate.h"
#include "planner/hardware.h"
#include "planner/pipeline.h"
#include "planner/plan_svg.h"
#include "planner/search.h"
#include "planner/time_model.h"
#include "sharding/comm/group.h"
#include "sharding/pipeline_schedule.h"

#include "engine/config.h"
#include "engine/plan_setup.h"
#include "models/model.h"
#include "sharding/step_plan.h"
#include "sharding/wrap.h"

namespace sw {

namespace {

// The --help texts: the first line is the summary `shardwise --help` lists.
const char* kPlanDumpAbout =
    "print the step plan a run executes, action by action\n"
    "\n"
    "Prints the plan of one training step (every micro-step, then the optimizer) as the\n"
    "executor runs it on each of N ranks: gathers, waits, forward/backward/recompute calls,\n"
    "frees, reduce-scatters and all-reduces, optimizer updates; for each its queue (compute,\n"
    "gather, reduce, io), unit, bytes moved, memory allocated (+) or freed (-) per category,\n"
    "and the actions it waits for. Nothing is allocated and nothing communicates.";

const char* kPlanAbout =
    "predict each rank's memory and step time; search a budget; calibrate\n"
    "\n"
    "Also: shardwise plan CONFIG.json --memory-budget BYTES [--host-budget BYTES]\n"
    "                      [--nvme-budget BYTES] [--nvme-path DIR] [--out BEST.json] ...\n"
    "      [mpirun -np N] shardwise plan [CONFIG.json] --calibrate [--out-hardware FILE]\n"
    "\n"
    "Predicts, without running the model or allocating its parameters, each rank's memory\n"
    "and step time for one training step of the config on N ranks: the step plan the executor\n"
    "runs (the same one `plan-dump` prints) replayed with the units' declared activation sizes.\n"
    "Per tier: the device's peak, the action at which it is reached and the bytes per category\n"
    "then (parameters, gradients, optimizer state, gathered units and gradients in flight\n"
    "(communication), saved activations, workspace); the host tier (offloaded state); the\n"
    "NVMe files. Beside it, what DeepSpeed's model-states estimate would say. The step time\n"
    "(compute, exposed communication, exposed I/O) comes from a hardware profile.\n"
    "The device peak is the whole tracked peak: the plan's and, on their own line, the kernel\n"
    "workspace the backend declares (LM head chunks, 16-bit operand copies, attention scratch).\n"
    "Not counted there: the allocator's rounding, the process (both in the RSS line).\n"
    "CONFIG.json is required except with --calibrate (then the config's shapes are measured,\n"
    "else GPT-2 124M's).";

struct PlanArgs {
  std::string config;
  std::vector<std::string> overrides;
  int world = 1;
  int hosts = 0;  // --hosts (0: the launcher's)
  bool eval = false, json = false;
  bool calibrate = false, timeline = false;
  std::string hardware, out_hardware, out, nvme_path, svg;
  std::string budget, host_budget, nvme_budget;  // as written; checked by add_budget
};

// --NAME BYTES for the search: a budget parse_budget reads ("8GiB", "512MiB", "8e9"); a value
// it cannot read is a usage mistake, caught before anything is built.
cli::Opt add_budget(cli::Command& c, const std::string& name, std::string& dest,
                    const std::string& help) {
  return c.checked(name, dest, "BYTES", help, [name](const std::string& v) -> std::string {
    try {
      if (parse_budget(v, name) > 0 || name != "--memory-budget") return {};
      return "the budget must be more than 0 bytes, got '" + v + "'";
    } catch (const Error&) {
      return "cannot parse '" + v + "' as bytes (e.g. 8GiB, 512MiB, 8e9)";
    }
  });
}

// plan_setup on pa.world ranks, with --hosts when given.
PlanSetup setup_of(const TrainConfig& cfg, const PlanArgs& pa) {
  PlanSetup s = plan_setup(cfg, pa.world);
  if (pa.hosts > 0) s.hosts = pa.hosts;
  return s;
}

// The plan a run of the config executes on pa.world ranks (training step, or eval).
StepPlan build_plan(const PlanArgs& pa, TrainConfig& cfg, int64_t& params, int64_t& largest) {
  cfg = load_config(pa.config, pa.overrides, pa.world);
  const Model whole = build_model(cfg.model);
  params = whole.num_params();
  // Tensor parallelism: tensor rank 0's units over the data-parallel ranks (every tensor rank's
  // plan has the same sizes).
  const int t = std::max(1, cfg.parallelism.tensor);
  Model model = build_model(cfg.model, TensorSlice{0, t});
  largest = 0;
  for (const auto& u : model.units) {
    int64_t n = 0;
    for (const ParamSpec& s : u->params()) n += numel(s.shape);
    largest = std::max(largest, n);
  }
  const PlanSetup s = setup_of(cfg, pa);  // as train() and `plan` see the config
  wrap_blocks(model, s.blocks_per_unit);
  PlanInput in = make_plan_input(model, s.policy, s.data_world());
  in.hosts = s.hosts;
  in.on_device = s.on_device;  // a device's copy streams (activation offload)
  in.B = s.micro_batch;
  in.T = s.model.seq_len;
  in.accum = s.accum;
  declare_calls(in, model);
  return pa.eval ? plan_eval(in) : plan_step(in);
}

nlohmann::json categories(const MemDeltas& d) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t c = 0; c < d.size(); ++c)
    if (d[c]) j[mem_name(static_cast<Mem>(c))] = d[c];
  return j;
}

std::string gib(int64_t b) {  // GiB from 1 GiB up, else MiB (a small model reads 0.00 GiB)
  char buf[32];
  const double v = static_cast<double>(b);
  if (b >= int64_t{1} << 30 || b <= -(int64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", v / double(int64_t{1} << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", v / double(int64_t{1} << 20));
  return buf;
}

int cmd_plan_dump(const PlanArgs& pa) {
  TrainConfig cfg = load_config(pa.config, pa.overrides, pa.world);
  if (cfg.parallelism.pipeline > 1 && !pa.eval) {  // every pipeline rank's plan (its stage's)
    const PipelinePrediction pp = predict_pipeline(setup_of(cfg, pa), nullptr, false);
    for (size_t r = 0; r < pp.stages.size(); ++r)
      std::cout << "# pipeline rank " << r << "\n" << pp.stages[r].plan.str();
    return 0;
  }
  int64_t params = 0, largest = 0;
  std::cout << build_plan(pa, cfg, params, largest).str();
  return 0;
}

// --hardware FILE, else the default profile when it exists; nullopt when there is none.
std::optional<HardwareProfile> resolve_hardware(const PlanArgs& pa) {
  if (!pa.hardware.empty()) return load_hardware(pa.hardware);
  const std::string d = default_hardware_path();
  std::error_code ec;
  if (std::filesystem::exists(d, ec)) return load_hardware(d);
  return std::nullopt;
}

std::string secs(double s) {
  char buf[32];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  else
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  return buf;
}

nlohmann::json time_json(const StepTime& t) {
  return {{"step_time_s", t.step_s},     {"compute_s", t.compute_s},
          {"exposed_comm_s", t.exposed_comm_s}, {"exposed_io_s", t.exposed_io_s},
          {"comm_busy_s", t.comm_s},     {"io_busy_s", t.io_s},
          {"model_flops", t.flops}};
}

int cmd_calibrate(const PlanArgs& pa) {
  CalibrateOptions opt;
  std::unique_ptr<Model> model;
  PlanInput in;
  GroupPtr world = world_group();
  const bool r0 = world->rank() == 0;
  int threads = 0;
  if (!pa.config.empty()) {
    const TrainConfig cfg = load_config(pa.config, pa.overrides, world->size());
    threads = cfg.threads;
    // (tensor parallelism: the shapes one tensor rank's units compute)
    model = std::make_unique<Model>(
        build_model(cfg.model, TensorSlice{0, std::max(1, cfg.parallelism.tensor)}));
    in = make_plan_input(*model, ShardingPolicy{}, 1);
    in.B = cfg.micro_batch;
    in.T = cfg.model.seq_len;
    declare_calls(in, *model);
    opt.shapes = calibration_shapes(model.get(), &in);
    opt.bf16 = true;
    const ShardingPolicy& sp = cfg.sharding;
    for (const std::string* p : {&sp.offload_optimizer.nvme_path, &sp.offload_param.nvme_path,
                                 &sp.activation_checkpointing.nvme_path})
      if (!p->empty()) opt.disk_path = *p;
  } else {
    opt.shapes = calibration_shapes(nullptr, nullptr);
  }
  if (!pa.nvme_path.empty()) opt.disk_path = pa.nvme_path;
  if (!opt.disk_path.empty()) {  // (made where missing, as the offload files' directories are)
    std::error_code ec;
    std::filesystem::create_directories(opt.disk_path, ec);
    if (ec) fail("plan", opt.disk_path + ": cannot create the directory (" + ec.message() + ")");
  }
  set_num_threads(threads);
  if (r0) opt.log = [](const std::string& l) { std::printf("%s\n", l.c_str()); std::fflush(stdout); };
  if (r0)
    std::printf("shardwise plan --calibrate: %d rank%s, shapes of %s\n", world->size(),
                world->size() == 1 ? "" : "s",
                pa.config.empty() ? "GPT-2 124M (B=4, T=256)" : pa.config.c_str());
  const HardwareProfile hw = calibrate(opt, world.get());
  if (!r0) return 0;
  const std::string out = pa.out_hardware.empty() ? default_hardware_path() : pa.out_hardware;
  save_hardware(hw, out);
  std::printf("hardware profile written to %s\n", out.c_str());
  return 0;
}

// Writes the chosen plan's config to --out. Runs as written: it reads back through train's
// checks, else it is removed and the reason is the error.
void write_plan_config(const PlanArgs& pa, const TrainConfig& cfg) {
  {
    std::ofstream f(pa.out);
    f << config_json(cfg) << "\n";
    if (!f) fail("plan", pa.out + ": cannot write the config");
  }
  try {
    load_config(pa.out, {}, pa.world);
  } catch (const Error& e) {
    std::error_code ec;
    std::filesystem::remove(pa.out, ec);
    fail("plan", pa.out + ": the chosen plan's config does not load (not written): " + e.what());
  }
}

void print_table_row(const Evaluated& e, bool mark, bool chosen) {
  std::printf("  %s %9s %9s %9s  %9s %9s %9s %9s  %s\n", chosen ? ">" : mark ? "*" : " ",
              format_bytes(size_t(e.device)).c_str(), format_bytes(size_t(e.host)).c_str(),
              format_bytes(size_t(e.nvme)).c_str(), secs(e.time.step_s).c_str(),
              secs(e.time.compute_s).c_str(), secs(e.time.exposed_comm_s).c_str(),
              secs(e.time.exposed_io_s).c_str(), e.c.describe().c_str());
}

int cmd_search(const PlanArgs& pa, TrainConfig cfg, const HardwareProfile& hw) {
  SearchOptions so;
  so.free.tensor = cfg.autoplan.tensor;  // parallelism.tensor_parallel_degree "auto"
  so.budget = parse_budget(pa.budget, "--memory-budget");
  if (so.budget <= 0) fail("plan", "--memory-budget: the budget must be more than 0 bytes");
  if (!pa.host_budget.empty()) so.host_budget = parse_budget(pa.host_budget, "--host-budget");
  if (!pa.nvme_budget.empty()) so.nvme_budget = parse_budget(pa.nvme_budget, "--nvme-budget");
  // Absolute, so the config --out writes runs from any directory.
  if (!pa.nvme_path.empty())
    so.nvme_path = std::filesystem::absolute(pa.nvme_path).lexically_normal().string();
  const PlanSetup base = setup_of(cfg, pa);
  const SearchResult r = search_plans(base, so, hw);
  // A plan that needs an NVMe directory nobody gave is not chosen; say which flag allows it.
  const std::string nvme_hint =
      r.nvme_would_help ? "with --nvme-path DIR, " + r.with_nvme.c.describe() + " would " +
                              (r.best < 0 ? "fit" : "be chosen") + " (device " +
                              format_bytes(size_t(r.with_nvme.device)) + ", step " +
                              secs(r.with_nvme.time.step_s) + ")"
                        : "";
  if (r.best < 0) {
    const double need = double(r.smallest.device) / (1.0 - so.margin);
    fail("plan", "no plan fits a memory budget of " + format_bytes(size_t(so.budget)) +
                     " per rank; the smallest feasible budget is " + format_bytes(size_t(need)) +
                     " (" + r.smallest.c.describe() + "), dominated by " +
                     dominant_category(r.smallest) + (nvme_hint.empty() ? "" : "; " + nvme_hint));
  }
  const Evaluated& best = r.frontier[size_t(r.best)];
  if (!pa.out.empty()) {
    const PlanSetup& s = r.chosen_setup;  // the search's paths filled in where the plan needs them
    cfg.sharding = s.policy;
    cfg.zero_stage = stage_of(s.policy.strategy);
    cfg.blocks_per_unit = s.blocks_per_unit;
    cfg.micro_batch = s.micro_batch;
    cfg.grad_accum = s.accum;
    cfg.parallelism.tensor = s.tensor;
    cfg.memory_budget = size_t(so.budget);
    write_plan_config(pa, cfg);
  }
  if (pa.json) {
    auto ev = [](const Evaluated& e) {
      return nlohmann::json{{"plan", e.c.describe()},   {"device_peak_bytes", e.device},
                            {"host_bytes", e.host},     {"nvme_bytes", e.nvme},
                            {"kernel_workspace_bytes", e.workspace}, {"fits", e.fits},
                            {"step_time", time_json(e.time)}};
    };
    nlohmann::json j;
    j["config"] = pa.config;
    j["world_size"] = pa.world;
    j["memory_budget"] = so.budget;
    j["hardware"] = hw.name;
    j["evaluated"] = r.evaluated;
    j["search_s"] = r.seconds;
    j["best"] = ev(best);  // the chosen plan
    j["fastest"] = ev(r.fastest);
    j["tie_rule"] = tie_rule(so.noise);
    j["noise"] = so.noise;
    if (r.nvme_would_help) j["with_nvme_path"] = ev(r.with_nvme);
    j["frontier"] = nlohmann::json::array();
    for (const Evaluated& e : r.frontier) j["frontier"].push_back(ev(e));
    if (!pa.out.empty()) j["out"] = pa.out;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("shardwise plan: %s on %d rank%s, budget %s per rank, hardware '%s'\n",
              pa.config.c_str(), pa.world, pa.world == 1 ? "" : "s",
              format_bytes(size_t(so.budget)).c_str(), hw.name.c_str());
  const std::string note =
      plan_shape_note(hw, pa.world, plan_threads(base.threads, pa.world), base.on_device);
  if (!note.empty()) std::printf("%s\n", note.c_str());
  std::printf("searched %d plans in %.2f s (per-rank batch %d x %d tokens)\n", r.evaluated,
              r.seconds, cfg.micro_batch * cfg.grad_accum, cfg.model.seq_len);
  std::printf("chosen plan: %s\n", best.c.describe().c_str());
  std::printf("  rule: %s\n", tie_rule(so.noise).c_str());
  if (r.fastest.c.describe() == best.c.describe())
    std::printf("  it is the fastest plan that fits\n");
  else
    std::printf("  the fastest plan that fits, %s, is predicted %.2f%% faster: within the noise\n",
                r.fastest.c.describe().c_str(),
                100.0 * (best.time.step_s / r.fastest.time.step_s - 1.0));
  if (!nvme_hint.empty()) std::printf("  %s\n", nvme_hint.c_str());
  std::printf("  device %s (plan %s + kernel workspace %s), host %s, nvme %s\n",
              format_bytes(size_t(best.device)).c_str(),
              format_bytes(size_t(best.device - best.workspace)).c_str(),
              format_bytes(size_t(best.workspace)).c_str(), format_bytes(size_t(best.host)).c_str(),
              format_bytes(size_t(best.nvme)).c_str());
  std::printf("  step %s = compute %s + exposed communication %s + exposed I/O %s\n",
              secs(best.time.step_s).c_str(), secs(best.time.compute_s).c_str(),
              secs(best.time.exposed_comm_s).c_str(), secs(best.time.exposed_io_s).c_str());
  std::printf("memory-vs-time frontier (* fits the budget, > the chosen plan):\n");
  std::printf("    %9s %9s %9s  %9s %9s %9s %9s  %s\n", "device", "host", "nvme", "step",
              "compute", "exp.comm", "exp.io", "plan");
  for (size_t i = 0; i < r.frontier.size(); ++i)
    print_table_row(r.frontier[i], r.frontier[i].fits, int(i) == r.best);
  if (!pa.out.empty()) std::printf("config written to %s\n", pa.out.c_str());
  return 0;
}

// What `shardwise plan` reports for one config: the prediction and what goes beside it.
struct PlanReport {
  const PlanArgs& pa;
  const TrainConfig& cfg;
  const std::optional<HardwareProfile>& hw;
  bool no_coll = false;  // the default profile has no collectives for this multi-rank plan
  PlanPrediction pred{};
  int64_t params = 0;
  // DeepSpeed's estimate_zero{3,2}_model_states_mem_needs without offload (per GPU): ZeRO-3
  // 4 x largest layer + 18 x params / N; ZeRO-2: 4 x params + 16 x params / N; stage 1 and 0:
  // as stage 2 (its estimator covers those).
  int64_t ds = 0;
  std::string ds_formula{};
  std::string at = "before the step";  // where the device peaks, in words
  nlohmann::json action = nullptr;     // and as data
  // The device peak with release_grads on, where the config has it off and it would be lower
  // (0: no such saving).
  int64_t released_peak = 0;
};

void print_plan_json(const PlanReport& r) {
  const StepPlan& plan = r.pred.plan;
  const PlanPeak& pk = r.pred.peak;
  const PlanPrediction& pred = r.pred;
  const int N = r.pa.world;
  const char* kinds[] = {"FULL_SHARDED", "FULL_REPLICATED", "WHOLE"};
  nlohmann::json j;
  j["config"] = r.pa.config;
  j["world_size"] = N;
  j["strategy"] = strategy_name(r.cfg.sharding.strategy);
  j["units"] = kinds[static_cast<size_t>(plan.kind)];
  j["params"] = r.params;
  j["activations_declared"] = plan.activations_known;
  j["ranks"] = nlohmann::json::array();
  // The device tier's peak is the whole tracked peak: the plan's peak (its categories at
  // `action`) and the kernel workspace the backend declares (category kernel_workspace;
  // the tracking allocator counts it as workspace).
  nlohmann::json at_peak = categories(pk.at_peak), cat_peaks = categories(pk.category_peak);
  if (pred.workspace) at_peak["kernel_workspace"] = cat_peaks["kernel_workspace"] = pred.workspace;
  const std::string includes =
      "the step plan's peak at `action` (plan_peak_bytes) + the kernel workspace "
      "(kernel_workspace_bytes: " + pred.workspace_what + "): the whole peak the tracking "
      "allocator counts on the device; categories sum to it";
  for (int rk = 0; rk < N; ++rk)  // equal shards: every rank's figures are the same
    j["ranks"].push_back(
        {{"rank", rk},
         {"tiers",
          {{"device", {{"peak_bytes", pred.device}, {"includes", includes},
                       {"plan_peak_bytes", pk.total},
                       {"kernel_workspace_bytes", pred.workspace}, {"action", r.action},
                       {"categories", at_peak},
                       {"category_peaks", cat_peaks}}},
           {"host", {{"peak_bytes", pred.host}, {"categories", categories(plan.persistent_host)},
                     {"updater_staging_bytes", plan.host_update_staging}}},
           {"nvme", {{"peak_bytes", plan.nvme_bytes}}}}},
         {"rss_bytes", pred.rss.total},
         {"rss", {{"tracked_bytes", pred.rss.tracked}, {"rounding_bytes", pred.rss.rounding},
                  {"data_bytes", pred.rss.data},
                  {"checkpoint_bytes", pred.rss.checkpoint},
                  {"untouched_staging_bytes", pred.rss.untouched},
                  {"baseline_bytes", pred.rss.baseline},
                  {"baseline_measured", pred.rss.baseline_measured}}},
         {"step_time", pred.timed ? time_json(pred.time) : nlohmann::json(nullptr)}});
  j["deepspeed_estimate"] = {{"formula", r.ds_formula}, {"bytes", r.ds}};
  j["release_grads_device_peak_bytes"] =
      r.released_peak ? nlohmann::json(r.released_peak) : nlohmann::json(nullptr);
  j["hardware"] = r.hw ? nlohmann::json(r.hw->name) : nlohmann::json(nullptr);
  j["step_time"] = pred.timed ? time_json(pred.time) : nlohmann::json(nullptr);
  std::cout << j.dump(2) << "\n";
}

// The step time's lines (and, with --timeline, every action's predicted interval).
void print_step_time(const PlanReport& r) {
  const StepPlan& plan = r.pred.plan;
  if (r.pred.timed) {
    const StepTime& t = r.pred.time;
    std::printf("step time (hardware '%s'): %s = compute %s + exposed communication %s + "
                "exposed I/O %s\n",
                r.hw->name.c_str(), secs(t.step_s).c_str(), secs(t.compute_s).c_str(),
                secs(t.exposed_comm_s).c_str(), secs(t.exposed_io_s).c_str());
    std::printf("  communication busy %s, I/O busy %s, %.2f TFLOP/s of model flops\n",
                secs(t.comm_s).c_str(), secs(t.io_s).c_str(),
                t.step_s > 0 ? t.flops / t.step_s / 1e12 : 0.0);
    // The profile's ranks x threads against the run's (planner/hardware.h plan_shape_note).
    const std::string note =
        plan_shape_note(*r.hw, r.pa.world, plan_threads(r.cfg.threads, r.pa.world),
                        r.pred.input.on_device);
    if (!note.empty()) std::printf("  %s\n", note.c_str());
    if (r.pa.timeline) {
      std::printf("predicted timeline (ms from the step's start):\n");
      for (size_t i = 0; i < plan.actions.size(); ++i) {
        const Action& a = plan.actions[i];
        std::printf("  %5zu %-8s %-16s %-12s %10.3f %10.3f\n", i, queue_name(a.queue),
                    action_kind_name(a.kind),
                    a.unit >= 0 ? plan.unit_names[size_t(a.unit)].c_str() : "",
                    t.begin[i] * 1e3, (t.end[i] - t.begin[i]) * 1e3);
      }
    }
  } else if (r.no_coll) {
    std::printf("step time: the profile %s has no collectives (calibrated at one rank): run "
                "`mpirun -np %d shardwise plan --calibrate`, or give --hardware FILE\n",
                default_hardware_path().c_str(), r.pa.world);
  } else {
    std::printf("step time: no hardware profile (run `shardwise plan --calibrate`, or give "
                "--hardware FILE)\n");
  }
}

void print_plan_text(const PlanReport& r) {
  const StepPlan& plan = r.pred.plan;
  const PlanPeak& pk = r.pred.peak;
  const PlanPrediction& pred = r.pred;
  const int N = r.pa.world;
  const double np = static_cast<double>(r.params);
  const std::string tensor =
      plan.tensor > 1 ? "tensor " + std::to_string(plan.tensor) + " x data " +
                            std::to_string(N / plan.tensor) + ": "
                      : "";
  std::printf("shardwise plan: %s on %d rank%s (%sshard group %d x %d replicas), %s, %.3f%s "
              "parameters\n",
              r.pa.config.c_str(), N, N == 1 ? "" : "s", tensor.c_str(), plan.S, plan.R,
              strategy_name(r.cfg.sharding.strategy), np >= 1e9 ? np / 1e9 : np / 1e6,
              np >= 1e9 ? "B" : "M");
  std::printf("every rank (equal shards):\n");
  std::printf("  device peak %s = the plan's peak %s at %s\n", gib(pred.device).c_str(),
              gib(pk.total).c_str(), r.at.c_str());
  std::string line = "   ";
  for (size_t c = 0; c < pk.at_peak.size(); ++c)
    if (pk.at_peak[c])
      line += std::string(" ") + mem_name(static_cast<Mem>(c)) + " " + gib(pk.at_peak[c]);
  std::printf("%s\n", line.c_str());
  // What the backend that runs the step declares for its kernels (kernels/ops.h
  // kernel_workspace): on a device, the CUDA Ops' scratch for the attention path they take.
  std::printf("    + kernel workspace %s (%s)\n", gib(pred.workspace).c_str(),
              pred.workspace_what.c_str());
  const int64_t host = pred.host;
  std::printf("  host        %s%s%s%s\n", gib(host).c_str(), host ? " (offloaded state" : "",
              plan.host_update_staging ? (", of which the host updater's staging " +
                                          gib(plan.host_update_staging)).c_str()
                                       : "",
              host ? ")" : "");
  std::printf("  nvme        %s%s\n", gib(plan.nvme_bytes).c_str(),
              plan.nvme_bytes ? " (offload files)" : "");
  const std::string ckpt =
      pred.rss.checkpoint == 0 ? "" : " + checkpoint saves " + gib(pred.rss.checkpoint);
  std::printf("  process RSS %s = %s + allocator rounding %s + token files %s + "
              "process baseline %s (%s)%s%s\n",
              gib(pred.rss.total).c_str(),
              pred.input.on_device ? "host (the device's memory is not resident here)"
                                   : "device + host",
              gib(pred.rss.rounding).c_str(), gib(pred.rss.data).c_str(),
              gib(pred.rss.baseline).c_str(),
              pred.rss.baseline_measured ? "calibrated" : "default: run `plan --calibrate`",
              ckpt.c_str(),
              pred.rss.untouched ? (" - staging pages no transfer writes " + gib(pred.rss.untouched)).c_str() : "");
  std::printf("DeepSpeed's model-states estimate: %s per rank (%s)\n", gib(r.ds).c_str(),
              r.ds_formula.c_str());
  if (r.released_peak)
    std::printf("with release_grads: device peak %s (%s less; gradients freed between steps, "
                "as PyTorch's zero_grad(set_to_none=True))\n",
                gib(r.released_peak).c_str(), gib(pred.device - r.released_peak).c_str());
  print_step_time(r);
  if (!r.pa.svg.empty()) std::printf("drawing written to %s\n", r.pa.svg.c_str());
}

// Pipeline parallelism: every pipeline rank's stage planned on its own (planner/pipeline.h),
// its peak and step; the stages' time simulated together (the bubble).
int cmd_plan_pipeline(const PlanArgs& pa, const TrainConfig& cfg,
                      const std::optional<HardwareProfile>& hw) {
  const PlanSetup s = setup_of(cfg, pa);
  const bool no_coll = hw && pa.world > 1 && !hw->has_collectives && pa.hardware.empty();
  const PipelinePrediction pp = predict_pipeline(s, hw && !no_coll ? &*hw : nullptr);
  const int P = s.pipeline, V = s.pipe_chunks, M = s.accum, N = pa.world;
  const char* sched = pipe_schedule_name(static_cast<PipeSchedule>(s.pipe_schedule));
  auto where = [&](const PlanPrediction& p) {
    if (p.peak.action < 0) return nlohmann::json(nullptr);
    const Action& a = p.plan.actions[size_t(p.peak.action)];
    return nlohmann::json{{"index", p.peak.action}, {"kind", action_kind_name(a.kind)},
                          {"unit", a.unit >= 0 ? nlohmann::json(p.plan.unit_names[size_t(a.unit)])
                                               : nlohmann::json(nullptr)},
                          {"micro", a.micro}, {"chunk", a.chunk}};
  };
  auto positions = [&](int rank) {  // the global positions of the rank's chunks
    std::vector<std::pair<int, int>> v;
    for (int c = 0; c < V; ++c)
      v.push_back({pp.bounds[size_t(c * P + rank)], pp.bounds[size_t(c * P + rank + 1)]});
    return v;
  };
  if (pa.json) {
    nlohmann::json j;
    j["config"] = pa.config;
    j["world_size"] = N;
    j["strategy"] = strategy_name(cfg.sharding.strategy);
    j["pipeline"] = {{"degree", P},        {"stages_per_rank", V},
                     {"schedule", sched},  {"micro_batches", M},
                     {"bounds", pp.bounds}, {"data_parallel", s.data_world()},
                     {"tensor", s.tensor}};
    if (pp.timed)
      j["pipeline"]["time"] = {{"step_time_s", pp.time.step_s},
                               {"pipeline_s", pp.time.pipeline_s},
                               {"bubble", pp.time.bubble},
                               {"theory_bubble", pp.time.theory_bubble},
                               {"simulation_rounds", pp.time.iterations}};
    j["stages"] = nlohmann::json::array();
    for (int r = 0; r < P; ++r) {
      const PlanPrediction& p = pp.stages[size_t(r)];
      nlohmann::json pos = nlohmann::json::array();
      for (auto [a, b] : positions(r)) pos.push_back({a, b});
      j["stages"].push_back(
          {{"pipeline_rank", r},
           {"positions", pos},
           {"device", {{"peak_bytes", p.device}, {"plan_peak_bytes", p.peak.total},
                       {"peak_bytes_sends_linger", pp.device_max[size_t(r)]},
                       {"kernel_workspace_bytes", p.workspace}, {"action", where(p)},
                       {"categories", categories(p.peak.at_peak)}}},
           {"host_bytes", p.host},
           {"rss_bytes", p.rss.total},
           {"step_time", p.timed ? time_json(p.time) : nlohmann::json(nullptr)}});
      if (p.timed) j["stages"].back()["step_time"]["exposed_p2p_s"] = p.time.exposed_p2p_s;
    }
    // Per rank of the world (pipeline outermost: rank k is in stage k / (N / P)).
    j["ranks"] = nlohmann::json::array();
    for (int k = 0; k < N; ++k) {
      const int r = k / std::max(1, N / P);
      const PlanPrediction& p = pp.stages[size_t(r)];
      j["ranks"].push_back({{"rank", k}, {"pipeline_rank", r},
                            {"tiers", {{"device", {{"peak_bytes", p.device}}},
                                       {"host", {{"peak_bytes", p.host}}}}}});
    }
    j["hardware"] = hw ? nlohmann::json(hw->name) : nlohmann::json(nullptr);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("shardwise plan: %s on %d ranks: pipeline %d x %d stage%s per rank (%s, %d "
              "micro-batches) x data %d x tensor %d, %s\n",
              pa.config.c_str(), N, P, V, V > 1 ? "s" : "", sched, M, s.data_world(), s.tensor,
              strategy_name(cfg.sharding.strategy));
  std::string b;
  for (size_t i = 0; i < pp.bounds.size(); ++i) b += (i ? " " : "") + std::to_string(pp.bounds[i]);
  std::printf("stage bounds (schedule positions): %s\n", b.c_str());
  for (int r = 0; r < P; ++r) {
    const PlanPrediction& p = pp.stages[size_t(r)];
    std::string pos;
    for (auto [a, e] : positions(r)) pos += (pos.empty() ? "" : ", ") + std::to_string(a) + "-" + std::to_string(e - 1);
    std::string at = "before the step";
    if (p.peak.action >= 0) {
      const Action& a = p.plan.actions[size_t(p.peak.action)];
      at = std::string(action_kind_name(a.kind)) +
           (a.unit >= 0 ? " " + p.plan.unit_names[size_t(a.unit)] : std::string()) + ", micro " +
           std::to_string(a.micro);
    }
    std::printf("pipeline rank %d (positions %s): device peak %s = plan %s at %s + kernel "
                "workspace %s; up to %s if its sends linger\n",
                r, pos.c_str(), gib(p.device).c_str(), gib(p.peak.total).c_str(), at.c_str(),
                gib(p.workspace).c_str(), gib(pp.device_max[size_t(r)]).c_str());
    std::string line = "   ";
    for (size_t c = 0; c < p.peak.at_peak.size(); ++c)
      if (p.peak.at_peak[c])
        line += std::string(" ") + mem_name(static_cast<Mem>(c)) + " " + gib(p.peak.at_peak[c]);
    std::printf("%s\n", line.c_str());
    if (p.timed && pa.timeline)
      for (size_t i = 0; i < p.plan.actions.size(); ++i) {
        const Action& a = p.plan.actions[i];
        std::printf("  r%d %5zu %-8s %-16s m%-3d c%-2d %-12s %10.3f %10.3f\n", r, i,
                    queue_name(a.queue), action_kind_name(a.kind), a.micro, a.chunk,
                    a.unit >= 0 ? p.plan.unit_names[size_t(a.unit)].c_str() : "",
                    p.time.begin[i] * 1e3, (p.time.end[i] - p.time.begin[i]) * 1e3);
      }
    if (p.timed)
      std::printf("    step %s = compute %s + exposed communication %s + waiting for neighbours "
                  "%s + exposed I/O %s\n",
                  secs(p.time.step_s).c_str(), secs(p.time.compute_s).c_str(),
                  secs(p.time.exposed_comm_s).c_str(), secs(p.time.exposed_p2p_s).c_str(),
                  secs(p.time.exposed_io_s).c_str());
  }
  if (pp.timed) {
    std::printf("step time (hardware '%s'): %s (the slowest rank); pipeline segment %s, bubble "
                "%.1f%% (theory %.1f%%: (P-1)/(%sV M+P-1)); the stages simulated together in "
                "%d rounds\n",
                hw->name.c_str(), secs(pp.time.step_s).c_str(), secs(pp.time.pipeline_s).c_str(),
                100 * pp.time.bubble, 100 * pp.time.theory_bubble,
                pipe_schedule_splits_backward(static_cast<PipeSchedule>(s.pipe_schedule)) ? "3 " : "",
                pp.time.iterations);
  } else if (no_coll) {
    std::printf("step time: the profile %s has no collectives (calibrated at one rank): run "
                "`mpirun -np %d shardwise plan --calibrate`, or give --hardware FILE\n",
                default_hardware_path().c_str(), N);
  } else {
    std::printf("step time: no hardware profile (run `shardwise plan --calibrate`, or give "
                "--hardware FILE)\n");
  }
  return 0;
}

// A config with pipeline parallelism under --memory-budget: the stage count, schedule and
// micro-batches searched (planner/pipeline.h search_pipeline), the rest as configured.
int cmd_search_pipeline(const PlanArgs& pa, TrainConfig cfg, const HardwareProfile& hw) {
  const int64_t budget = parse_budget(pa.budget, "--memory-budget");
  const PlanSetup base = setup_of(cfg, pa);
  const PipelineSearch r = search_pipeline(base, budget, hw);
  if (r.best < 0) {
    const PipelineEvaluated* small = nullptr;
    for (const PipelineEvaluated& e : r.evaluated)
      if (!small || e.device < small->device) small = &e;
    fail("plan", "no pipeline plan fits a memory budget of " + format_bytes(size_t(budget)) +
                     " per rank" + (small ? "; the smallest largest-stage peak is " +
                                                format_bytes(size_t(small->device)) + " (" +
                                                small->c.describe() + ")"
                                          : std::string()));
  }
  const PipelineEvaluated& best = r.evaluated[size_t(r.best)];
  if (!pa.out.empty()) {
    ParallelismConfig& pp = cfg.parallelism;
    pp.pipeline = best.c.pipeline;
    pp.schedule = pipe_schedule_name(static_cast<PipeSchedule>(best.c.schedule));
    pp.virtual_stages = best.c.chunks > 1 ? best.c.chunks : 0;
    pp.split_points.clear();
    cfg.micro_batch = best.c.micro_batch;
    cfg.grad_accum = best.c.accum;
    cfg.memory_budget = size_t(budget);
    write_plan_config(pa, cfg);
  }
  if (pa.json) {
    auto ev = [](const PipelineEvaluated& e) {
      return nlohmann::json{{"plan", e.c.describe()}, {"device_peak_bytes", e.device},
                            {"largest_stage", e.stage}, {"step_time_s", e.step_s},
                            {"bubble", e.bubble}, {"fits", e.fits}};
    };
    nlohmann::json j;
    j["config"] = pa.config;
    j["world_size"] = pa.world;
    j["memory_budget"] = budget;
    j["hardware"] = hw.name;
    j["best"] = ev(best);
    j["evaluated"] = nlohmann::json::array();
    for (const PipelineEvaluated& e : r.evaluated) j["evaluated"].push_back(ev(e));
    if (!pa.out.empty()) j["out"] = pa.out;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("shardwise plan: %s on %d ranks, budget %s per rank, hardware '%s': %zu pipeline "
              "plans (stages, schedule, micro-batches; global batch kept)\n",
              pa.config.c_str(), pa.world, format_bytes(size_t(budget)).c_str(), hw.name.c_str(),
              r.evaluated.size());
  std::printf("chosen plan: %s: largest stage %s (pipeline rank %d), step %s, bubble %.1f%%\n",
              best.c.describe().c_str(), format_bytes(size_t(best.device)).c_str(), best.stage,
              secs(best.step_s).c_str(), 100 * best.bubble);
  std::printf("  %-30s %10s %10s %8s\n", "plan", "device", "step", "bubble");
  for (size_t i = 0; i < r.evaluated.size(); ++i) {
    const PipelineEvaluated& e = r.evaluated[i];
    std::printf("%s %-30s %10s %10s %7.1f%%\n", int(i) == r.best ? ">" : e.fits ? "*" : " ",
                e.c.describe().c_str(), format_bytes(size_t(e.device)).c_str(),
                secs(e.step_s).c_str(), 100 * e.bubble);
  }
  if (!pa.out.empty()) std::printf("config written to %s\n", pa.out.c_str());
  return 0;
}

int cmd_plan(const PlanArgs& pa) {
  if (pa.calibrate) return cmd_calibrate(pa);
  // The budgets were checked while parsing (add_budget), so a typo costs nothing.
  TrainConfig cfg = load_config(pa.config, pa.overrides, pa.world);
  const std::optional<HardwareProfile> hw = resolve_hardware(pa);
  if (!pa.budget.empty()) {
    if (cfg.parallelism.pipeline > 1) {
      if (!hw)
        fail("plan", "--memory-budget needs a hardware profile: run `shardwise plan --calibrate` "
                     "or give --hardware FILE");
      return cmd_search_pipeline(pa, cfg, *hw);
    }
    if (!hw)
      fail("plan", "--memory-budget needs a hardware profile: run `shardwise plan --calibrate` or "
                   "give --hardware FILE (e.g. configs/hardware/h100_nccl.json)");
    return cmd_search(pa, cfg, *hw);
  }
  if (cfg.parallelism.pipeline > 1) {
    if (!pa.svg.empty())
      fail("plan", "--svg: not drawn for pipeline parallelism yet (--json has every stage)");
    return cmd_plan_pipeline(pa, cfg, hw);
  }
  PlanReport r{pa, cfg, hw};
  int64_t largest = 0;
  {
    Model model = build_model(cfg.model);
    r.params = model.num_params();
    for (const auto& u : model.units) {
      int64_t n = 0;
      for (const ParamSpec& s : u->params()) n += numel(s.shape);
      largest = std::max(largest, n);
    }
  }
  // The default profile calibrated at one rank cannot time a multi-rank plan: say so and
  // predict memory only (an explicit --hardware without collectives is an error).
  r.no_coll = hw && pa.world > 1 && !hw->has_collectives && pa.hardware.empty();
  r.pred = predict_plan(setup_of(cfg, pa), hw && !r.no_coll ? &*hw : nullptr);
  if (!cfg.sharding.release_grads) {  // what release_grads would save (memory only)
    PlanSetup rel = setup_of(cfg, pa);
    rel.policy.release_grads = true;
    const int64_t peak = predict_plan(rel, nullptr).device;
    if (peak < r.pred.device) r.released_peak = peak;
  }
  const StepPlan& plan = r.pred.plan;
  const PlanPeak& pk = r.pred.peak;
  const int N = pa.world;
  const bool z3 = cfg.sharding.strategy == ShardingStrategy::FullShard ||
                  cfg.sharding.strategy == ShardingStrategy::ShardGradOp ||
                  cfg.sharding.strategy == ShardingStrategy::HybridShard;
  r.ds = z3 ? 4 * largest + 18 * r.params / N : 4 * r.params + 16 * r.params / N;
  r.ds_formula = z3 ? "estimate_zero3_model_states_mem_needs: 4 x largest unit + 18 x params / N"
                    : "estimate_zero2_model_states_mem_needs: 4 x params + 16 x params / N";
  if (pk.action >= 0) {
    const Action& a = plan.actions[size_t(pk.action)];
    r.at = "action " + std::to_string(pk.action) + " (" + action_kind_name(a.kind) +
           (a.unit >= 0 ? " " + plan.unit_names[size_t(a.unit)] : std::string()) +
           ", micro-step " + std::to_string(a.micro) + ")";
    r.action = {{"index", pk.action}, {"kind", action_kind_name(a.kind)},
                {"unit", a.unit >= 0 ? nlohmann::json(plan.unit_names[size_t(a.unit)])
                                     : nlohmann::json(nullptr)},
                {"micro", a.micro}};
  }
  if (!pa.svg.empty())
    write_plan_svg(plan_svg_of(r.pred, N, "shardwise plan: " + pa.config + ", " + std::to_string(N) +
                                              " rank" + (N == 1 ? "" : "s") + ", " +
                                              strategy_name(cfg.sharding.strategy)),
                   pa.svg);
  if (pa.json)
    print_plan_json(r);
  else
    print_plan_text(r);
  return 0;
}

}  // namespace

void add_plan_commands(cli::Command& top) {
  auto pa = std::make_shared<PlanArgs>();
  cli::Command plan = top.sub("plan", kPlanAbout);
  plan.config(pa->config, /*required=*/false);
  plan.integer("--world-size", pa->world, 1, 65536, "N", "ranks of the run (default 1)");
  plan.integer("--hosts", pa->hosts, 1, 65536, "H",
               "hosts the ranks sit on, equally many each (default: the launcher's, else 1): a\n"
               "group spanning hosts is timed over the profile's collectives.across_hosts link");
  const cli::Opt json = plan.flag("--json", pa->json,
                                  "the same as JSON (bytes, seconds), in the units of\n"
                                  "profile's peaks_rank<r>.json");
  plan.overrides(pa->overrides);
  plan.text("--hardware", pa->hardware, "FILE",
            "the hardware profile (default: $SHARDWISE_HARDWARE, else\n"
            "~/.cache/shardwise/hardware.json when it exists)");
  cli::Opt calibrate = plan.flag("--calibrate", pa->calibrate,
                                 "measure this machine at this world size (run under mpirun for\n"
                                 "collectives) with the config's shapes, and write the profile");
  plan.text("--out-hardware", pa->out_hardware, "FILE",
            "where --calibrate writes (default: the default profile path)");
  const cli::Opt budget =
      add_budget(plan, "--memory-budget", pa->budget,
                 "search the plans that fit BYTES per rank (8GiB, 512MiB, 8e9):\n"
                 "blocks_per_unit, ZeRO stage, prefetch, checkpointing, offload,\n"
                 "micro-batch x accumulation at the config's per-rank batch");
  add_budget(plan, "--host-budget", pa->host_budget,
             "with --memory-budget: host-tier bytes per rank (default: no limit)")
      .needs(budget);
  add_budget(plan, "--nvme-budget", pa->nvme_budget,
             "with --memory-budget: NVMe bytes per rank (default: no limit)")
      .needs(budget);
  plan.text("--nvme-path", pa->nvme_path, "DIR",
            "consider NVMe offload to DIR (default: the config's nvme_path;\n"
            "--calibrate: the directory whose disk is measured, default /tmp)");
  plan.text("--out", pa->out, "FILE",
            "with --memory-budget: write the chosen plan as a ready-to-run\n"
            "config (memory_budget set, NVMe paths from --nvme-path or the\n"
            "config's); it is read back through train's checks")
      .needs(budget);
  plan.flag("--timeline", pa->timeline, "also print every action's predicted start and duration");
  plan.text("--svg", pa->svg, "FILE",
            "draw the predicted peak per rank and tier, stacked by category, and the\n"
            "predicted RSS, as an SVG");
  calibrate.excludes(budget).excludes(json);  // --calibrate measures only
  plan.on_run([pa, plan] {
    if (pa->config.empty() && !pa->calibrate) plan.usage_fail("missing CONFIG.json");
    return cmd_plan(*pa);
  });

  auto pd = std::make_shared<PlanArgs>();
  cli::Command dump = top.sub("plan-dump", kPlanDumpAbout);
  dump.config(pd->config);
  dump.integer("--world-size", pd->world, 1, 65536, "N",
               "ranks of the run (default 1); HYBRID_SHARD without\n"
               "shard_group_size shards within a node as `train` does (the\n"
               "launcher's ranks per node when they divide N, else all N)");
  dump.flag("--eval", pd->eval, "the evaluation forward instead of a training step");
  dump.overrides(pd->overrides);
  dump.on_run([pd] { return cmd_plan_dump(*pd); });
}

}  // namespace sw
