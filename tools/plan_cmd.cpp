// `shardwise plan-dump CONFIG [--world-size N] [--eval] [--set k=v]...`: builds the model the
// config describes (no parameters are allocated) and prints the StepPlan that a run of N ranks
// executes each step (sharding/step_plan.h): every action with its queue, unit, bytes moved,
// memory allocated or freed per category and the actions it waits for.
#include "tools/plan_cmd.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

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

int usage(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "shardwise: %s\nTry 'shardwise plan-dump --help'.\n", msg.c_str());
  return 2;
}

}  // namespace

int cmd_plan_dump(const std::vector<std::string>& args) {
  std::string config;
  std::vector<std::string> overrides;
  int world = 1;
  bool eval = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::cout << kPlanDumpHelp;
      return 0;
    } else if (a == "--world-size" || a == "--set") {
      if (i + 1 >= args.size()) return usage(a + " expects a value");
      const std::string& v = args[++i];
      if (a == "--set") {
        if (v.find('=') == std::string::npos || v.front() == '=')
          return usage("--set expects KEY=VALUE, got '" + v + "'");
        overrides.push_back(v);
      } else {
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end || n < 1 || n > 65536)
          return usage("--world-size expects a whole number from 1 to 65536, got '" + v + "'");
        world = static_cast<int>(n);
      }
    } else if (a == "--eval") {
      eval = true;
    } else if (!a.empty() && a[0] == '-') {
      return usage("unknown option '" + a + "' for 'plan-dump'");
    } else if (config.empty()) {
      config = a;
    } else {
      return usage("unexpected argument '" + a + "'");
    }
  }
  if (config.empty()) return usage("missing CONFIG.json");
  const TrainConfig cfg = load_config(config, overrides, world);
  Model model = build_model(cfg.model);
  wrap_blocks(model, cfg.blocks_per_unit);
  ShardingPolicy policy = cfg.sharding;
  if (policy.strategy == ShardingStrategy::HybridShard && policy.shard_group_size == 0)
    policy.shard_group_size = world;  // the trainer shards within a node; here: over all N
  PlanInput in = make_plan_input(model, policy, world);
  in.B = cfg.micro_batch;
  in.T = cfg.model.seq_len;
  in.accum = cfg.grad_accum;
  declare_calls(in, model);
  const StepPlan plan = eval ? plan_eval(in) : plan_step(in);
  std::cout << plan.str();
  return 0;
}

}  // namespace sw
