// train() in bf16 and fp16 against fp32 over 200 steps of the default model's shape
// (configs/default.json: GPT-2, d_model 128, 4 layers, 4 heads, byte vocabulary; here
// seq_len 64, micro-batch 4, one thread) on generated English-like text: about 4 s of CPU
// per 200-step run.
#include <cstdio>

#include "core/env.h"
#include "mp_test_util.h"

using namespace sw;
using namespace sw::mptest;

namespace {

const std::vector<double>& fp32_losses() {
  static const std::vector<double> l = [] {
    const TrainConfig c = config("fp32");
    train(c, quiet());
    return losses(read_metrics(c.run_dir));
  }();
  return l;
}

// The curves are compared as means over windows of 20 steps (single steps are noisy: one
// batch each), from step `from` on: the gap of every window below 0.05 nats and the last
// window within 3% of fp32's. fp16 starts at 2^16, where this model's first steps overflow;
// the skipped steps shift its schedule and data by a step or two, which matters only while
// the loss falls fast, so fp16 is compared from step 60. Observed on this branch (parameter
// and gradient rounding only; the matrix products' own bf16/fp16 operand rounding comes with
// the kernels): bf16 worst window gap 0.008 nats, last window +0.4%; fp16 (2 skipped steps)
// worst gap after step 60 0.024 nats, last window +1.3%.
void check_tracks(const std::vector<double>& l, const char* what, size_t from) {
  const std::vector<double>& ref = fp32_losses();
  REQUIRE(l.size() == ref.size());
  double worst = 0;
  for (size_t a = from; a + 20 <= l.size(); a += 20)
    worst = std::max(worst, std::fabs(mean(l, a, a + 20) - mean(ref, a, a + 20)));
  const double last = mean(l, l.size() - 20, l.size()),
               ref_last = mean(ref, ref.size() - 20, ref.size());
  INFO(what << ": worst window gap " << worst << " nats; last window " << last << " vs fp32 "
            << ref_last << "; first " << ref[0]);
  CHECK(worst < 0.05);
  CHECK(std::fabs(last - ref_last) < 0.03 * ref_last);
  CHECK(ref_last < 0.5 * ref[0]);  // the model did learn
  if (sw::env_flag("SHARDWISE_TEST_MP_VERBOSE"))
    std::printf("%s: worst window gap %.4f, last %.4f vs %.4f\n", what, worst, last, ref_last);
}

}  // namespace

TEST_CASE("mixed precision: bf16 and fp16 track the fp32 loss curve over 200 steps") {
  const TrainConfig b = config("bf16", {"bf16.enabled=true"});
  REQUIRE(b.sharding.mixed_precision.param_dtype == DType::BF16);
  const TrainSummary sb = train(b, quiet());
  const auto mb = read_metrics(b.run_dir);
  check_tracks(losses(mb), "bf16", 0);
  CHECK(sb.skipped_steps == 0);
  CHECK(!mb[0].contains("loss_scale"));  // no scaling in bf16

  const TrainConfig f = config("fp16", {"fp16.enabled=true"});
  const TrainSummary sf = train(f, quiet());
  const auto mf = read_metrics(f.run_dir);
  check_tracks(losses(mf), "fp16", 60);
  // A few early overflows at most; each lowers the scale (after the first, hysteresis 2), and
  // the window (1000) never completes.
  CHECK(sf.skipped_steps <= 4);
  CHECK(mf[0]["loss_scale"].get<double>() == 65536);
  CHECK(sf.loss_scale == std::ldexp(65536.0, -std::max(0, sf.skipped_steps - 1)));
}
