// The public facades (include/shardwise/sharded_model.h, planner.h, checkpoint.h) against the
// engine's own interfaces they wrap (sharding/sharded_model.h, planner/search.h): the same
// losses bit for bit, the same predictions, checkpoints that continue a run exactly, and
// one-line errors for the bad input issue 40 names.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <random>
#include <vector>

#include "examples/external/tiny_units.h"
#include "planner/search.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "tests/common/temp_dir.h"

namespace {

struct Tokens {
  std::vector<int32_t> tok, tgt;
  sw::Batch make(int B, int T, unsigned seed) {
    std::mt19937 rng(seed);
    tok.resize(size_t(B) * T);
    tgt.resize(size_t(B) * T);
    for (size_t i = 0; i < tok.size(); ++i) {
      tok[i] = int32_t(rng() % tiny::kVocab);
      tgt[i] = (tok[i] * 7 + 3) % tiny::kVocab;  // learnable: a function of the token
    }
    return {tok.data(), tgt.data(), B, T};
  }
};

// The facade's options as the engine's loop uses them (the reference loop below).
sw::api::ShardedOptions options() {
  sw::api::ShardedOptions o;
  o.lr = 5e-3f;
  o.weight_decay = 0.01f;
  o.clip_grad_norm = 0.5f;  // small: clipping happens
  o.use_mpi_world = false;
  return o;
}

// A unit that declares the parameter "dup.w" twice.
class Duplicate final : public sw::Unit {
 public:
  std::string name() const override { return "dup"; }
  std::vector<sw::ParamSpec> params() const override {
    return {{.name = "dup.w", .shape = {4, tiny::kDim}}, {.name = "dup.w", .shape = {4, tiny::kDim}}};
  }
  void forward(sw::UnitCtx&, int, const float*, float*) override {}
  void backward(sw::UnitCtx&, int, const float*, const float*, float*) override {}
};

bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == std::string::npos; }

}  // namespace

TEST_CASE("api::ShardedModel trains as the engine's own loop does, bit for bit", "[api]") {
  sw::Model a = tiny::custom_model(), b = tiny::custom_model(), c = tiny::custom_model();
  const sw::api::ShardedOptions o = options();
  sw::api::ShardedModel api(a, o);
  sw::api::ShardedOptions o_rel = o;  // gradients freed between steps: the same bits
  o_rel.release_grads = true;
  sw::api::ShardedModel rel(c, o_rel);
  // The reference: the internal ShardedModel driven by hand (zero, forward+backward, global
  // norm, clip to clip_grad_norm, AdamW at lr).
  sw::ShardedModel ref(b, sw::ops_for(sw::Device::cpu()), o.seed, sw::make_local_group(),
                       sw::ShardingPolicy::for_strategy(sw::ShardingStrategy::FullShard));
  sw::OptimizerParams p;
  p.lr = o.lr;
  p.weight_decay = o.weight_decay;
  Tokens t;
  double first = 0, last = 0;
  for (int s = 1; s <= 12; ++s) {
    const sw::Batch batch = t.make(4, 8, unsigned(s));
    const sw::api::StepResult r = api.train_step(batch);
    const sw::api::StepResult rr = rel.train_step(batch);
    ref.zero_grads();
    const double loss = ref.forward_backward(batch, 1.f);
    const double norm = ref.grad_norm();
    ref.optimizer_step(p, o.lr, norm > o.clip_grad_norm ? float(o.clip_grad_norm / norm) : 1.f, s);
    CHECK(r.step == s);
    CHECK(r.loss == loss);
    CHECK(r.grad_norm == norm);
    CHECK(rr.loss == loss);
    CHECK(rr.grad_norm == norm);
    if (s == 1) first = r.loss;
    last = r.loss;
  }
  CHECK(last < first);
  CHECK(api.num_params() == ref.num_params());
  CHECK(api.step() == 12);
  CHECK(api.world() == 1);
  // for_each_param: the same tensors as the engine's.
  std::vector<float> mine, theirs;
  api.for_each_param([&](const std::string&, const float* d, int64_t n) { mine.insert(mine.end(), d, d + n); });
  ref.for_each_param([&](const sw::ParamSpec& s, const float* d) { theirs.insert(theirs.end(), d, d + sw::numel(s.shape)); });
  CHECK(mine == theirs);
  // An lr given to train_step replaces the options' (a different update than the reference's).
  const sw::Batch batch = t.make(4, 8, 99u);
  api.train_step(batch, 0.5f);
  const double moved = api.eval_loss(batch);
  ref.zero_grads();
  ref.forward_backward(batch, 1.f);
  const double n = ref.grad_norm();
  ref.optimizer_step(p, o.lr, n > o.clip_grad_norm ? float(o.clip_grad_norm / n) : 1.f, 13);
  CHECK(moved != ref.eval_loss(batch));
}

TEST_CASE("api::ShardedModel: a loaded checkpoint continues the run bit for bit", "[api]") {
  swtest::TempDir dir("api_ckpt");
  Tokens t;
  sw::Model a = tiny::custom_model();  // (its config's type is the user's own)
  sw::api::ShardedModel one(a, options());
  for (int s = 1; s <= 5; ++s) one.train_step(t.make(4, 8, unsigned(s)));
  one.save(dir.file("step_5"));
  sw::api::verify_checkpoint(dir.file("step_5"));
  CHECK(sw::api::describe_checkpoint(dir.file("step_5")).find("mlp.0.w1") != std::string::npos);
  std::vector<double> after;
  for (int s = 6; s <= 8; ++s) after.push_back(one.train_step(t.make(4, 8, unsigned(s))).loss);

  sw::Model b = tiny::custom_model();
  sw::api::ShardedModel two(b, options());
  two.load(dir.file("step_5"));
  CHECK(two.step() == 5);
  for (int s = 6; s <= 8; ++s) CHECK(two.train_step(t.make(4, 8, unsigned(s))).loss == after[size_t(s - 6)]);
  // and into the object that saved, after it trained on
  one.load(dir.file("step_5"));
  CHECK(one.train_step(t.make(4, 8, 6u)).loss == after[0]);

  // A damaged shard: one line naming the file.
  {
    std::fstream f(dir.file("step_5/rank_0.safetensors"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-16, std::ios::end);
    f.put('\x5a');
  }
  try {
    sw::api::verify_checkpoint(dir.file("step_5"));
    FAIL("a damaged checkpoint verified");
  } catch (const sw::Error& e) {
    CHECK(one_line(e.what()));
    CHECK(std::string(e.what()).find("rank_0.safetensors") != std::string::npos);
  }
  CHECK_THROWS_AS(sw::api::resolve_checkpoint(dir.file("nothing_here")), sw::Error);
}

TEST_CASE("api::ShardedModel: bad input is one line naming the key, unit or parameter", "[api]") {
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const sw::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  sw::Model m = tiny::custom_model();
  sw::api::ShardedOptions o = options();
  o.strategy = "FULL_SHARDED";
  std::string e = message([&] { sw::api::ShardedModel sm(m, o); });
  CHECK(one_line(e));
  CHECK(e.find("FULL_SHARDED") != std::string::npos);
  o = options();
  o.strategy = "HYBRID_SHARD";
  e = message([&] { sw::api::ShardedModel sm(m, o); });
  CHECK((one_line(e) && e.find("HYBRID_SHARD") != std::string::npos));
  o = options();
  o.lr = 0;
  e = message([&] { sw::api::ShardedModel sm(m, o); });
  CHECK((one_line(e) && e.find("lr") != std::string::npos));
  o = options();
  o.optimizer = "Adamax";
  e = message([&] { sw::api::ShardedModel sm(m, o); });
  CHECK((one_line(e) && e.find("Adamax") != std::string::npos));

  sw::Model d = tiny::custom_model();
  d.units.push_back(std::make_unique<Duplicate>());
  e = message([&] { sw::api::ShardedModel sm(d, options()); });
  INFO(e);
  CHECK(one_line(e));
  CHECK(e.find("dup.w") != std::string::npos);
}

TEST_CASE("api::predict_step gives the planner's figures", "[api]") {
  sw::api::PlanRequest r;
  r.world = 4;
  r.micro_batch = 8;
  r.seq_len = 32;
  const sw::api::PlanFigures f = sw::api::predict_step(tiny::custom_model(), r);
  sw::PlanSetup s;
  s.model = tiny::custom_model().config;
  s.model.seq_len = 32;
  s.world = 4;
  s.micro_batch = 8;
  const sw::PlanPrediction p = sw::predict_plan(tiny::custom_model(), s, nullptr);
  CHECK(f.device_peak == p.device);
  CHECK(f.activations == p.peak.at_peak[size_t(sw::Mem::Activations)]);
  CHECK(f.rss == p.rss.total);
  CHECK(f.activations > 0);
  CHECK_FALSE(f.timed);
  r.world = 0;
  CHECK_THROWS_AS(sw::api::predict_step(tiny::custom_model(), r), sw::Error);
}
