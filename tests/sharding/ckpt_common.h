// Shared by the activation-checkpointing tests (test_checkpointing.cpp, one rank;
// test_checkpointing_mpi.cpp, two ranks): tiny GPT-2 / Llama configurations, a batch, the
// checkpointing variants and gradient snapshots compared byte for byte.
#pragma once
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "models/model.h"
#include "sharding/policy.h"
#include "sharding/sharded_model.h"
#include "tests/common/mpi_test_util.h"

namespace ckpt {

using namespace sw;

inline ModelConfig tiny(const std::string& type) { return swtest::tiny_config(type, 4); }

struct Data {
  std::vector<int32_t> tokens, targets;
  Batch batch;
  Data(int B, int T, int V, uint64_t seed) : tokens(size_t(B) * T), targets(size_t(B) * T) {
    Rng r(seed);
    for (auto& t : tokens) t = static_cast<int32_t>(r.below(static_cast<uint64_t>(V)));
    for (auto& t : targets) t = static_cast<int32_t>(r.below(static_cast<uint64_t>(V)));
    targets[1] = -1;  // an ignored position
    batch = {tokens.data(), targets.data(), B, T};
  }
};

struct Variant {
  std::string name;
  ActivationCheckpointing ac;
};

inline ActivationCheckpointing ac_of(CheckpointMode m, int every = 1, std::vector<int> units = {}) {
  ActivationCheckpointing a;
  a.mode = m;
  a.every = every;
  a.units = std::move(units);
  return a;
}

// Off first (the reference), then every way of selecting units. Unit indices: 0 is the
// embedding (GPT-2: embedding and tied head), blocks from 1.
inline std::vector<Variant> variants() {
  using M = CheckpointMode;
  return {{"off", ac_of(M::Off)},
          {"full", ac_of(M::Full)},
          {"selective", ac_of(M::Selective)},
          {"full every=2", ac_of(M::Full, 2)},
          {"selective every=2", ac_of(M::Selective, 2)},
          {"full units=[1,4]", ac_of(M::Full, 1, {1, 4})},
          {"selective units=[2,3]", ac_of(M::Selective, 1, {2, 3})}};
}

// Every gradient (and the losses) of `steps` optimizer steps of 2 accumulated micro-batches
// each, flattened in for_each_grad order; gradients of the last step.
struct Snapshot {
  std::vector<double> losses;
  std::vector<float> grads;
  bool same_bits(const Snapshot& o) const {
    // (memcmp may not be given the null data() of an empty vector, even for 0 bytes)
    return losses.size() == o.losses.size() && grads.size() == o.grads.size() &&
           (losses.empty() ||
            std::memcmp(losses.data(), o.losses.data(), losses.size() * sizeof(double)) == 0) &&
           (grads.empty() ||
            std::memcmp(grads.data(), o.grads.data(), grads.size() * sizeof(float)) == 0);
  }
};

inline Snapshot run(ShardedModel& sm, const std::vector<const Data*>& micro, int steps) {
  Snapshot s;
  for (int step = 1; step <= steps; ++step) {
    sm.zero_grads();
    for (size_t i = 0; i < micro.size(); ++i)
      s.losses.push_back(sm.forward_backward(micro[i]->batch, 1.f, i + 1 == micro.size()));
    s.grads.clear();
    sm.for_each_grad([&](const ParamSpec& p, const float* g) {
      s.grads.insert(s.grads.end(), g, g + numel(p.shape));
    });
    sm.optimizer_step(AdamWParams{}, 1e-2f, 1.f, step);
  }
  return s;
}

}  // namespace ckpt
