// LossScaler: DeepSpeed's dynamic loss-scale rules (window doubling, hysteresis, the
// min_loss_scale floor and the error below it) and the static scale, step by step.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "engine/loss_scaler.h"
#include "engine/metrics.h"

using namespace sw;
using Catch::Matchers::Contains;

namespace {
LossScaler make(int power, int window, int hysteresis, double min_scale = 1,
                bool consecutive = false) {
  LossScalerConfig c;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.min_loss_scale = min_scale;
  c.consecutive_hysteresis = consecutive;
  return LossScaler(c);
}
}  // namespace

TEST_CASE("loss scaler: defaults are DeepSpeed's") {
  const LossScaler s{LossScalerConfig{}};
  CHECK(s.dynamic());
  CHECK(s.scale == 65536.0);  // 2^16
  CHECK(s.hysteresis_left == 2);
  CHECK(s.good_steps == 0);
  CHECK(s.cfg.loss_scale_window == 1000);
  CHECK(s.cfg.min_loss_scale == 1);
}

TEST_CASE("loss scaler: the scale doubles after every window of good steps") {
  LossScaler s = make(4, 3, 2);
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale == 16);
  CHECK(s.update(false));
  CHECK(s.scale == 32);
  CHECK(s.good_steps == 3);
  for (int i = 0; i < 3; ++i) CHECK(s.update(false));
  CHECK(s.scale == 64);
  // An overflow restarts the count: two good steps, an overflow, then a full window again.
  LossScaler t = make(4, 3, 1);
  t.update(false), t.update(false);
  CHECK_FALSE(t.update(true));
  CHECK(t.scale == 8);
  CHECK(t.good_steps == 0);
  t.update(false), t.update(false);
  CHECK(t.scale == 8);
  t.update(false);
  CHECK(t.scale == 16);
}

TEST_CASE("loss scaler: hysteresis tolerates overflows before halving") {
  LossScaler s = make(10, 4, 3);
  CHECK(s.hysteresis_left == 3);
  CHECK_FALSE(s.update(true));  // uses one up
  CHECK(s.scale == 1024);
  CHECK(s.hysteresis_left == 2);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale == 1024);
  CHECK(s.hysteresis_left == 1);
  CHECK_FALSE(s.update(true));  // none left: halve, and every further overflow halves
  CHECK(s.scale == 512);
  CHECK(s.hysteresis_left == 1);
  // A good step does not give hysteresis back (consecutive_hysteresis false) ...
  CHECK(s.update(false));
  CHECK(s.hysteresis_left == 1);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale == 256);
  // ... a doubling does.
  for (int i = 0; i < 4; ++i) s.update(false);
  CHECK(s.scale == 512);
  CHECK(s.hysteresis_left == 3);
  // consecutive_hysteresis: every good step restores it.
  LossScaler c = make(10, 100, 2, 1, true);
  CHECK_FALSE(c.update(true));
  CHECK(c.hysteresis_left == 1);
  CHECK(c.update(false));
  CHECK(c.hysteresis_left == 2);
  CHECK_FALSE(c.update(true));
  CHECK(c.scale == 1024);
}

TEST_CASE("loss scaler: min_loss_scale is a floor, and overflowing at it is an error") {
  LossScaler s = make(3, 1000, 1, 3.0);  // 8
  CHECK_FALSE(s.update(true));
  CHECK(s.scale == 4);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale == 3);  // max(2, 3)
  CHECK_THROWS_WITH(s.update(true), Contains("fp16: gradients overflow at the minimum loss scale"));
  // With hysteresis left, an overflow at the floor only uses it up.
  LossScaler h = make(0, 1000, 2, 1.0);
  CHECK_FALSE(h.update(true));
  CHECK(h.scale == 1);
  CHECK_THROWS(h.update(true));
}

TEST_CASE("loss scaler: a static scale never changes: overflow still skips") {
  LossScalerConfig c;
  c.loss_scale = 128;
  LossScaler s(c);
  CHECK_FALSE(s.dynamic());
  CHECK(s.scale == 128);
  CHECK_FALSE(s.update(true));
  CHECK_FALSE(s.update(true));
  CHECK_FALSE(s.update(true));
  CHECK(s.scale == 128);
  for (int i = 0; i < 2000; ++i) CHECK(s.update(false));
  CHECK(s.scale == 128);
}

TEST_CASE("metrics: overflow, skipped_steps and loss_scale in the JSON line and progress") {
  StepMetrics m;
  m.step = 3, m.loss = 2.0, m.grad_norm = NAN, m.overflow = true, m.skipped_steps = 2;
  std::string line = metrics_json_line(m);
  CHECK_THAT(line, Contains("\"overflow\":true"));
  CHECK_THAT(line, Contains("\"skipped_steps\":2"));
  CHECK_THAT(line, Contains("\"grad_norm\":null"));
  CHECK_THAT(line, !Contains("loss_scale"));  // not fp16
  m.loss_scale = 32768;
  CHECK_THAT(metrics_json_line(m), Contains("\"loss_scale\":32768"));
  FILE* f = std::tmpfile();
  REQUIRE(f);
  Progress p(10, 1, true, f, 0);
  p.update(m, 1.0);
  m.step = 4, m.skipped_steps = 0;
  p.update(m, 2.0);
  std::rewind(f);
  char buf[512] = {0};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string out(buf, n);
  CHECK_THAT(out, Contains("step 3/10 | loss 2.0000 | val - | 0 tok/s | skipped 2 | ETA"));
  CHECK_THAT(out, Contains("step 4/10 | loss 2.0000 | val - | 0 tok/s | ETA"));
}
