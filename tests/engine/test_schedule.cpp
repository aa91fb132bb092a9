// LR schedules against their closed forms at the steps where the formulas change.
#include <catch2/catch.hpp>
#include <cmath>

#include "engine/schedule.h"

using namespace sw;

namespace {
constexpr double kPi = 3.14159265358979323846;
OptimizerConfig opt(float lr) {
  OptimizerConfig o;
  o.lr = lr;
  return o;
}
}  // namespace

TEST_CASE("schedule: WarmupCosineLR is linear warmup then cosine to cos_min_ratio") {
  SchedulerConfig s;
  s.type = "WarmupCosineLR";
  s.warmup_num_steps = 10;
  s.total_num_steps = 110;
  s.warmup_min_ratio = 0.0f;
  s.cos_min_ratio = 0.1f;
  const OptimizerConfig o = opt(2.0f);
  CHECK(lr_at(o, s, 999, 0) == 0.0f);                       // warmup starts at lr * r0
  CHECK(lr_at(o, s, 999, 5) == Approx(1.0).epsilon(1e-6));  // half way
  CHECK(lr_at(o, s, 999, 9) == Approx(1.8).epsilon(1e-6));
  // First step after warmup: cosine progress 1/100.
  CHECK(lr_at(o, s, 999, 10) ==
        Approx(2.0 * (0.1 + 0.9 * 0.5 * (1 + std::cos(kPi / 100)))).epsilon(1e-6));
  CHECK(lr_at(o, s, 999, 59) == Approx(2.0 * 0.55).epsilon(1e-6));  // progress 1/2
  CHECK(lr_at(o, s, 999, 109) == Approx(0.2).epsilon(1e-6));        // last step: lr * rc
  CHECK(lr_at(o, s, 999, 500) == Approx(0.2).epsilon(1e-6));        // stays there
  // Monotone non-increasing after warmup.
  for (int i = 10; i < 115; ++i) CHECK(lr_at(o, s, 999, i + 1) <= lr_at(o, s, 999, i));
}

TEST_CASE("schedule: warmup_min_ratio and total 0 meaning train_steps and no warmup") {
  SchedulerConfig s;
  s.warmup_num_steps = 4;
  s.warmup_min_ratio = 0.5f;
  s.cos_min_ratio = 0.0f;
  const OptimizerConfig o = opt(1.0f);
  CHECK(lr_at(o, s, 20, 0) == Approx(0.5));
  CHECK(lr_at(o, s, 20, 2) == Approx(0.75));
  CHECK(lr_at(o, s, 20, 19) == Approx(0.0).margin(1e-7));  // total = train_steps = 20
  CHECK(lr_at(o, s, 20, 11) == Approx(0.5 * (1 + std::cos(kPi * 8 / 16))).epsilon(1e-6));
  s.warmup_num_steps = 0;
  CHECK(lr_at(o, s, 20, 0) == Approx(0.5 * (1 + std::cos(kPi / 20))).epsilon(1e-6));
  s.warmup_num_steps = 20;  // all warmup, no decay phase
  CHECK(lr_at(o, s, 20, 25) == 1.0f);
}

TEST_CASE("schedule: log warmup as DeepSpeed defines it") {
  SchedulerConfig s;
  s.type = "WarmupLR";
  s.warmup_type = "log";
  s.warmup_num_steps = 100;
  const OptimizerConfig o = opt(1.0f);
  CHECK(lr_at(o, s, 1000, 0) == 0.0f);                        // ln(1) = 0
  CHECK(lr_at(o, s, 1000, 9) == Approx(0.5).epsilon(1e-6));   // ln 10 / ln 100
  CHECK(lr_at(o, s, 1000, 99) == Approx(1.0).epsilon(1e-6));  // ln 100 / ln 100
}

TEST_CASE("schedule: WarmupLR holds lr after warmup and Constant is constant") {
  SchedulerConfig s;
  s.type = "WarmupLR";
  s.warmup_num_steps = 8;
  const OptimizerConfig o = opt(3e-4f);
  CHECK(lr_at(o, s, 100, 4) == Approx(1.5e-4));
  CHECK(lr_at(o, s, 100, 8) == 3e-4f);
  CHECK(lr_at(o, s, 100, 99) == 3e-4f);
  s.type = "Constant";
  for (int i : {0, 1, 7, 8, 99, 1000}) CHECK(lr_at(o, s, 100, i) == 3e-4f);
}
