// The optimizer tests' model and reference (test_optimizers.cpp, test_optimizers_mpi.cpp): two
// units of two tensors each whose backward adds fixed gradients (integer formulas, dyadic
// values: identical on every rank, and their average over 2 or 4 ranks exact), and the
// PyTorch reference of tests/sharding/gen_optimizer_reference.py read from
// tests/sharding/data/optimizer_reference.json.
#pragma once
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"

namespace optest {

struct TensorDef {
  const char* name;
  sw::Shape shape;
  bool wd;
};
inline const std::vector<TensorDef>& tensors() {
  static const std::vector<TensorDef> t = {
      {"a.w", {7, 13}, true}, {"a.b", {13}, false}, {"b.w", {5, 11}, true}, {"b.g", {11}, false}};
  return t;
}
// The generator's param_init and grad_at.
inline float param_init(int k, int64_t i) { return float(((i * 37 + k * 11) % 41 - 20) / 32.0); }
inline float grad_at(int k, int64_t i, int t) {
  return float(((i * 13 + k * 7 + t * 29) % 31 - 15) / 64.0);
}

inline int g_step = 1;  // the step whose gradients backward adds
constexpr int kC = 4;   // the activations' width (zeros throughout)

// Unit u holds tensors 2u and 2u + 1; unit 1's call is the loss (0).
class FixedGrads final : public sw::Unit {
 public:
  explicit FixedGrads(int u) : u_(u) {}
  std::string name() const override { return u_ == 0 ? "a" : "b"; }
  std::vector<sw::ParamSpec> params() const override {
    std::vector<sw::ParamSpec> ps;
    for (int k = 2 * u_; k < 2 * u_ + 2; ++k) {
      sw::ParamSpec p;
      p.name = tensors()[size_t(k)].name;
      p.shape = tensors()[size_t(k)].shape;
      p.init = sw::Init::Zeros;
      p.weight_decay = tensors()[size_t(k)].wd;
      ps.push_back(p);
    }
    return ps;
  }
  void forward(sw::UnitCtx& c, int, const float*, float* y) override {
    const int N = c.batch->B * c.batch->T;
    if (u_ == 0) {
      c.ops->fill(y, 0.f, size_t(N) * kC);
      return;
    }
    c.loss_count += N;  // (a loss of 0)
  }
  void backward(sw::UnitCtx& c, int, const float*, const float*, float* dx) override {
    const int N = c.batch->B * c.batch->T;
    if (u_ == 1) c.ops->fill(dx, 0.f, size_t(N) * kC);
    for (int j = 0; j < 2; ++j) {
      const int k = 2 * u_ + j;
      const int64_t n = sw::numel(tensors()[size_t(k)].shape);
      std::vector<float> g(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) g[size_t(i)] = grad_at(k, i, g_step);
      float* dst = c.grad(size_t(j));
      for (int64_t i = 0; i < n; ++i) dst[i] += g[size_t(i)];
    }
  }

 private:
  int u_;
};

inline sw::Model make_model() {
  sw::Model m;
  m.config.type = "test";
  m.config.vocab_size = 8;
  m.config.d_model = kC;
  m.config.n_layer = 1;
  m.units.push_back(std::make_unique<FixedGrads>(0));
  m.units.push_back(std::make_unique<FixedGrads>(1));
  m.schedule = {{0, 0}, {1, 0}};
  return m;
}

inline void set_initial(sw::ShardedModel& sm) {
  for (int k = 0; k < int(tensors().size()); ++k) {
    const int64_t n = sw::numel(tensors()[size_t(k)].shape);
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = param_init(k, i);
    sm.set_param(tensors()[size_t(k)].name, v.data(), n);
  }
}

inline nlohmann::json reference() {
  std::ifstream f(std::string(SW_SOURCE_DIR) + "/tests/sharding/data/optimizer_reference.json");
  return nlohmann::json::parse(f);
}

// A configuration of the reference file as OptimizerParams (and its grad_mult).
inline sw::OptimizerParams params_of(const nlohmann::json& c, float* grad_mult) {
  sw::OptimizerParams p;
  p.type = sw::optimizer_type_from_name(c.at("type").get<std::string>());
  p.lr = c.at("lr").get<float>();
  p.weight_decay = c.at("weight_decay").get<float>();
  auto opt = [&](const char* k, float& x) {
    if (c.contains(k)) x = c.at(k).get<float>();
  };
  opt("momentum", p.momentum);
  opt("dampening", p.dampening);
  opt("trust_coefficient", p.trust_coefficient);
  opt("eps", p.eps);
  opt("beta1", p.beta1);
  opt("beta2", p.beta2);
  opt("max_coeff", p.max_coeff);
  opt("min_coeff", p.min_coeff);
  if (c.contains("nesterov")) p.nesterov = c.at("nesterov").get<bool>();
  if (c.contains("bias_correction")) p.bias_correction = c.at("bias_correction").get<bool>();
  *grad_mult = c.at("grad_mult").get<float>();
  return p;
}

// `steps` optimizer steps on the fixed gradients; the parameters after each of `save_at`.
inline std::map<int, std::map<std::string, std::vector<float>>> run(
    sw::ShardedModel& sm, const sw::OptimizerParams& p, float grad_mult, int steps,
    const std::vector<int>& save_at) {
  set_initial(sm);
  std::vector<int32_t> tok(2, 1), tgt(2, 1);
  const sw::Batch b{tok.data(), tgt.data(), 1, 2};
  std::map<int, std::map<std::string, std::vector<float>>> out;
  for (int t = 1; t <= steps; ++t) {
    g_step = t;
    sm.zero_grads();
    sm.forward_backward(b);
    sm.optimizer_step(p, p.lr, grad_mult, t);
    for (int s : save_at)
      if (s == t)
        sm.for_each_param([&](const sw::ParamSpec& ps, const float* d) {
          out[t][ps.name].assign(d, d + sw::numel(ps.shape));
        });
  }
  return out;
}

}  // namespace optest
