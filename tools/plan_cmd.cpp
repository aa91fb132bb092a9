// `shardwise plan-dump CONFIG [--world-size N] [--eval] [--set k=v]...`: builds the model the
// config describes (no parameters are allocated) and prints the StepPlan that a run of N ranks
// executes each step (sharding/step_plan.h): every action with its queue, unit, bytes moved,
// memory allocated or freed per category and the actions it waits for.
#include "tools/plan_cmd.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <nlohmann/json.hpp>

#include "core/bytes.h"

#include "engine/config.h"
#include "models/model.h"
#include "sharding/step_plan.h"
#include "sharding/wrap.h"

namespace sw {

namespace {

const char* kPlanDumpHelp =
    "Usage: shardwise plan-dump CONFIG.json [--world-size N] [--eval] [--set key.path=value]...\n"
    "\n"
    "Prints the plan of one training step (every micro-step, then the optimizer) as the\n"
    "executor runs it on each of N ranks: gathers, waits, forward/backward/recompute calls,\n"
    "frees, reduce-scatters and all-reduces, optimizer updates; for each its queue (compute,\n"
    "gather, reduce, io), unit, bytes moved, memory allocated (+) or freed (-) per category,\n"
    "and the actions it waits for. Nothing is allocated and nothing communicates.\n"
    "\n"
    "Options:\n"
    "  --world-size N   ranks of the run (default 1); HYBRID_SHARD without shard_group_size\n"
    "                   shards over all N (a run under mpirun shards within a node)\n"
    "  --eval           the evaluation forward instead of a training step\n"
    "  --set K=V        override a config key, as for `train`\n"
    "  -h, --help       show this help\n";

const char* kPlanHelp =
    "Usage: shardwise plan CONFIG.json [--world-size N] [--json] [--set key.path=value]...\n"
    "\n"
    "Predicts, without running the model or allocating its parameters, each rank's memory\n"
    "for one training step of the config on N ranks: the step plan the executor runs (the\n"
    "same one `plan-dump` prints) replayed with the units' declared activation sizes. Per\n"
    "tier: the device's peak, the action at which it is reached and the bytes per category\n"
    "then (parameters, gradients, optimizer state, gathered units and gradients in flight\n"
    "(communication), saved activations, workspace); the host tier (offloaded state); the\n"
    "NVMe files. Beside it, what DeepSpeed's model-states estimate would say.\n"
    "Not counted yet: kernel workspaces that units do not declare (LM head chunks, bf16\n"
    "packing), the allocator's rounding, the process itself.\n"
    "\n"
    "Options:\n"
    "  --world-size N   ranks of the run (default 1)\n"
    "  --json           the same as JSON (bytes), in the units of profile's peaks_rank<r>.json\n"
    "  --set K=V        override a config key, as for `train`\n"
    "  -h, --help       show this help\n";

int usage(const std::string& cmd, const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "shardwise: %s\nTry 'shardwise %s --help'.\n", msg.c_str(), cmd.c_str());
  return 2;
}

struct PlanArgs {
  std::string config;
  std::vector<std::string> overrides;
  int world = 1;
  bool eval = false, json = false;
};

// Parses the options of `plan-dump` and `plan`; returns -1 to go on, else an exit code.
int parse_plan_args(const std::string& cmd, const std::vector<std::string>& args, PlanArgs& pa) {
  std::string& config = pa.config;
  std::vector<std::string>& overrides = pa.overrides;
  int& world = pa.world;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::cout << (cmd == "plan" ? kPlanHelp : kPlanDumpHelp);
      return 0;
    } else if (a == "--world-size" || a == "--set") {
      if (i + 1 >= args.size()) return usage(cmd, a + " expects a value");
      const std::string& v = args[++i];
      if (a == "--set") {
        if (v.find('=') == std::string::npos || v.front() == '=')
          return usage(cmd, "--set expects KEY=VALUE, got '" + v + "'");
        overrides.push_back(v);
      } else {
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end || n < 1 || n > 65536)
          return usage(cmd, "--world-size expects a whole number from 1 to 65536, got '" + v + "'");
        world = static_cast<int>(n);
      }
    } else if (a == "--eval" && cmd == "plan-dump") {
      pa.eval = true;
    } else if (a == "--json" && cmd == "plan") {
      pa.json = true;
    } else if (!a.empty() && a[0] == '-') {
      return usage(cmd, "unknown option '" + a + "' for '" + cmd + "'");
    } else if (config.empty()) {
      config = a;
    } else {
      return usage(cmd, "unexpected argument '" + a + "'");
    }
  }
  if (config.empty()) return usage(cmd, "missing CONFIG.json");
  return -1;
}

// The plan a run of the config executes on pa.world ranks (training step, or eval).
StepPlan build_plan(const PlanArgs& pa, TrainConfig& cfg, int64_t& params, int64_t& largest) {
  cfg = load_config(pa.config, pa.overrides, pa.world);
  const int world = pa.world;
  Model model = build_model(cfg.model);
  params = model.num_params();
  largest = 0;
  for (const auto& u : model.units) {
    int64_t n = 0;
    for (const ParamSpec& s : u->params()) n += numel(s.shape);
    largest = std::max(largest, n);
  }
  wrap_blocks(model, cfg.blocks_per_unit);
  ShardingPolicy policy = cfg.sharding;
  if (policy.strategy == ShardingStrategy::HybridShard && policy.shard_group_size == 0)
    policy.shard_group_size = world;  // the trainer shards within a node; here: over all N
  PlanInput in = make_plan_input(model, policy, world);
  in.B = cfg.micro_batch;
  in.T = cfg.model.seq_len;
  in.accum = cfg.grad_accum;
  declare_calls(in, model);
  return pa.eval ? plan_eval(in) : plan_step(in);
}

nlohmann::json categories(const MemDeltas& d) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t c = 0; c < d.size(); ++c)
    if (d[c]) j[mem_name(static_cast<Mem>(c))] = d[c];
  return j;
}

std::string gib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / double(int64_t{1} << 30));
  return buf;
}

}  // namespace

int cmd_plan_dump(const std::vector<std::string>& args) {
  PlanArgs pa;
  if (const int rc = parse_plan_args("plan-dump", args, pa); rc >= 0) return rc;
  TrainConfig cfg;
  int64_t params = 0, largest = 0;
  std::cout << build_plan(pa, cfg, params, largest).str();
  return 0;
}

int cmd_plan(const std::vector<std::string>& args) {
  PlanArgs pa;
  if (const int rc = parse_plan_args("plan", args, pa); rc >= 0) return rc;
  TrainConfig cfg;
  int64_t params = 0, largest = 0;
  const StepPlan plan = build_plan(pa, cfg, params, largest);
  const PlanPeak pk = replay_peak(plan);
  int64_t host = 0;
  for (int64_t b : plan.persistent_host) host += b;
  // DeepSpeed's estimate_zero{3,2}_model_states_mem_needs without offload (per GPU): ZeRO-3
  // 4 x largest layer + 18 x params / N; ZeRO-2: 4 x params + 16 x params / N; stage 1 and 0:
  // as stage 2 (its estimator covers those).
  const int N = pa.world;
  const bool z3 = cfg.sharding.strategy == ShardingStrategy::FullShard ||
                  cfg.sharding.strategy == ShardingStrategy::ShardGradOp ||
                  cfg.sharding.strategy == ShardingStrategy::HybridShard;
  const int64_t ds = z3 ? 4 * largest + 18 * params / N : 4 * params + 16 * params / N;
  const std::string ds_formula = z3 ? "estimate_zero3_model_states_mem_needs: 4 x largest unit + 18 x params / N"
                                    : "estimate_zero2_model_states_mem_needs: 4 x params + 16 x params / N";
  const char* kinds[] = {"FULL_SHARDED", "FULL_REPLICATED", "WHOLE"};
  std::string at = "before the step";
  nlohmann::json action = nullptr;
  if (pk.action >= 0) {
    const Action& a = plan.actions[size_t(pk.action)];
    at = "action " + std::to_string(pk.action) + " (" + action_kind_name(a.kind) +
         (a.unit >= 0 ? " " + plan.unit_names[size_t(a.unit)] : std::string()) + ", micro-step " +
         std::to_string(a.micro) + ")";
    action = {{"index", pk.action}, {"kind", action_kind_name(a.kind)},
              {"unit", a.unit >= 0 ? nlohmann::json(plan.unit_names[size_t(a.unit)]) : nlohmann::json(nullptr)},
              {"micro", a.micro}};
  }
  if (pa.json) {
    nlohmann::json j;
    j["config"] = pa.config;
    j["world_size"] = N;
    j["strategy"] = strategy_name(cfg.sharding.strategy);
    j["units"] = kinds[static_cast<size_t>(plan.kind)];
    j["params"] = params;
    j["activations_declared"] = plan.activations_known;
    j["ranks"] = nlohmann::json::array();
    for (int r = 0; r < N; ++r)  // equal shards: every rank's figures are the same
      j["ranks"].push_back(
          {{"rank", r},
           {"tiers",
            {{"device", {{"peak_bytes", pk.total}, {"action", action},
                         {"categories", categories(pk.at_peak)},
                         {"category_peaks", categories(pk.category_peak)}}},
             {"host", {{"peak_bytes", host}, {"categories", categories(plan.persistent_host)}}},
             {"nvme", {{"peak_bytes", plan.nvme_bytes}}}}}});
    j["deepspeed_estimate"] = {{"formula", ds_formula}, {"bytes", ds}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("shardwise plan: %s on %d rank%s (shard group %d x %d replicas), %s, %.3fB parameters\n",
              pa.config.c_str(), N, N == 1 ? "" : "s", plan.S, plan.R,
              strategy_name(cfg.sharding.strategy), static_cast<double>(params) / 1e9);
  std::printf("every rank (equal shards):\n");
  std::printf("  device peak %s at %s\n", gib(pk.total).c_str(), at.c_str());
  std::string line = "   ";
  for (size_t c = 0; c < pk.at_peak.size(); ++c)
    if (pk.at_peak[c])
      line += std::string(" ") + mem_name(static_cast<Mem>(c)) + " " + gib(pk.at_peak[c]);
  std::printf("%s\n", line.c_str());
  std::printf("  host        %s%s\n", gib(host).c_str(), host ? " (offloaded state)" : "");
  std::printf("  nvme        %s%s\n", gib(plan.nvme_bytes).c_str(),
              plan.nvme_bytes ? " (offload files)" : "");
  if (!plan.activations_known)
    std::printf("  (some unit does not declare its activation sizes: activations not counted)\n");
  std::printf("DeepSpeed's model-states estimate: %s per rank (%s)\n", gib(ds).c_str(),
              ds_formula.c_str());
  std::printf("not counted: undeclared kernel workspaces, allocator rounding, the process itself\n");
  return 0;
}

}  // namespace sw
