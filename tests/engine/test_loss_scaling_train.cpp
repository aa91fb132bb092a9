// fp16 loss scaling end to end through train(): forced overflow (skipped steps leave the
// weights untouched, the scale falls as the hysteresis rules say, the LR schedule counts
// applied steps, training then proceeds), static scales, and the metrics. A smaller model than
// the default (d_model 64, 2 layers, seq_len 32) keeps it to seconds.
#include "checkpoint/export.h"
#include "checkpoint/hf_export.h"
#include "engine/schedule.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "mp_test_util.h"
#include "sharding/sharded_model.h"

using namespace sw;
using namespace sw::mptest;

namespace {
TrainConfig small(const std::string& run, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"model.d_model=64", "model.n_layer=2", "model.seq_len=32", "threads=1",
                               "scheduler.params.warmup_num_steps=2"});
  return config(run, extra);
}
}  // namespace

TEST_CASE("mixed precision: forced fp16 overflow skips steps, lowers the scale, then trains") {
  // At 2^30 every early step overflows (fp16 ends at 65504). Hysteresis 2: the first overflow
  // keeps the scale, each later one halves it, until gradients fit.
  const TrainConfig c = small("overflow", {"fp16.enabled=true", "fp16.initial_scale_power=30",
                                           "train_steps=60"});
  const TrainSummary s = train(c, quiet());
  const auto m = read_metrics(c.run_dir);
  REQUIRE(m.size() == 60);
  int first_good = -1;
  for (size_t i = 0; i < m.size(); ++i)
    if (!m[i]["overflow"].get<bool>()) {
      first_good = static_cast<int>(i);
      break;
    }
  INFO("first step without overflow: " << first_good + 1 << ", scale then "
                                       << m[size_t(std::max(first_good, 0))]["loss_scale"]);
  REQUIRE(first_good >= 2);
  CHECK(m[0]["loss_scale"].get<double>() == std::ldexp(1.0, 30));
  CHECK(m[1]["loss_scale"].get<double>() == std::ldexp(1.0, 30));  // hysteresis used up
  for (int i = 2; i <= first_good; ++i)
    CHECK(m[size_t(i)]["loss_scale"].get<double>() == std::ldexp(1.0, 30 - (i - 1)));
  int skipped = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    skipped += m[i]["overflow"].get<bool>();
    CHECK(m[i]["skipped_steps"].get<int>() == skipped);
    if (m[i]["overflow"].get<bool>()) CHECK(m[i]["grad_norm"].is_null());
  }
  CHECK(s.skipped_steps == skipped);
  CHECK(skipped >= first_good);
  // The LR schedule counts applied steps only (DeepSpeed): the first applied step uses the
  // schedule's step 0 (warm-up from 0), the next one step 1.
  CHECK(m[size_t(first_good)]["lr"].get<double>() ==
        lr_at(c.optimizer, c.scheduler, c.train_steps, 0));
  // Training proceeds: the loss falls well below where it started.
  const std::vector<double> l = losses(m);
  CHECK(mean(l, 50, 60) < 0.7 * l[0]);

  // Skipped steps leave the weights exactly as initialised: a run of only overflowing steps
  // exports the same bytes as the untrained model.
  const TrainConfig k = small("overflow_only", {"fp16.enabled=true",
                                                "fp16.initial_scale_power=30",
                                                 "train_steps=" + std::to_string(first_good)});
  const TrainSummary sk = train(k, quiet(true));
  CHECK(sk.skipped_steps == first_good);
  Model model = build_model(k.model);
  ShardedModel init(model, ops_for(Device::cpu()), k.seed);
  const std::string init_dir = (test_dir() / "init_hf").string();
  export_hf_dir(init, init_dir, HfExportOptions{});
  CHECK(read_bytes(sk.weights_path + "/model.safetensors") ==
        read_bytes(init_dir + "/model.safetensors"));
}

TEST_CASE("mixed precision: a static fp16 loss scale stays fixed: overflow at it only skips") {
  const TrainConfig c = small("static", {"fp16.enabled=true", "fp16.loss_scale=1024",
                                         "train_steps=20"});
  const TrainSummary s = train(c, quiet());
  const auto m = read_metrics(c.run_dir);
  CHECK(s.skipped_steps == 0);
  for (const auto& x : m) CHECK(x["loss_scale"].get<double>() == 1024);
  // Tracks fp32 over these 20 steps (the scale only changes fp16 rounding): observed 0.004
  // nats on the mean.
  const TrainConfig f32 = small("static_fp32", {"train_steps=20"});
  train(f32, quiet());
  const std::vector<double> l = losses(m), ref = losses(read_metrics(f32.run_dir));
  INFO("static 1024: mean loss " << mean(l, 0, 20) << " vs fp32 " << mean(ref, 0, 20));
  CHECK(std::fabs(mean(l, 0, 20) - mean(ref, 0, 20)) < 0.05);
  // A static scale far too large: every step overflows and is skipped, the scale stays.
  const TrainConfig big = small("static_big", {"fp16.enabled=true", "fp16.loss_scale=1e30",
                                                "train_steps=4"});
  const TrainSummary sb = train(big, quiet());
  CHECK(sb.skipped_steps == 4);
  for (const auto& x : read_metrics(big.run_dir)) {
    CHECK(x["loss_scale"].get<double>() == 1e30);
    CHECK(x["overflow"].get<bool>());
  }
}
