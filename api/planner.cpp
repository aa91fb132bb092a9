// The public function of shardwise/planner.h over the memory planner (planner/search.h).
#include "shardwise/planner.h"

#include "planner/hardware.h"
#include "shardwise/error.h"
#include "planner/search.h"
#include "sharding/policy.h"

namespace sw::api {

PlanFigures predict_step(Model model, const PlanRequest& r) {
  if (r.world < 1) fail("planner", "PlanRequest: world: must be >= 1");
  if (r.micro_batch < 1) fail("planner", "PlanRequest: micro_batch: must be >= 1");
  if (r.accum < 1) fail("planner", "PlanRequest: accum: must be >= 1");
  if (r.seq_len < 0) fail("planner", "PlanRequest: seq_len: must be >= 0 (0: the model's)");
  PlanSetup s;
  s.model = model.config;
  if (r.seq_len > 0) s.model.seq_len = r.seq_len;
  s.world = r.world;
  s.micro_batch = r.micro_batch;
  s.accum = r.accum;
  s.policy = ShardingPolicy::for_strategy(strategy_from_name(r.strategy));
  if (s.policy.strategy == ShardingStrategy::HybridShard)
    s.policy.shard_group_size = r.world;  // one shard group: the planner's per-rank figures
  validate(s.policy, r.world);
  HardwareProfile hw;
  const bool timed = !r.hardware_profile.empty();
  if (timed) hw = load_hardware(r.hardware_profile);
  const PlanPrediction p = predict_plan(std::move(model), s, timed ? &hw : nullptr,
                                        r.measure_unknown);
  PlanFigures f;
  f.device_peak = p.device;
  f.activations = p.peak.at_peak[size_t(Mem::Activations)];
  f.workspace = p.workspace;
  f.host = p.host;
  f.nvme = p.nvme;
  f.rss = p.rss.total;
  f.timed = p.timed;
  f.step_seconds = p.timed ? p.time.step_s : 0;
  for (const UndeclaredCall& u : p.measured)
    f.measured.push_back(u.name + " call " + std::to_string(u.call));
  return f;
}

}  // namespace sw::api
