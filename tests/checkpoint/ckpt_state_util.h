// Shared by the checkpoint tests: a few AdamW steps on a one-rank model (so that master, m and
// v all hold distinct, non-trivial values), and a model's whole state read back for
// bit-for-bit comparison.
#pragma once
#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "sharding/sharded_model.h"

namespace ckpttest {

// `steps` AdamW steps (lr 1e-2) on batches of 2 x 8 tokens below `vocab`.
inline void train(sw::ShardedModel& sm, int steps, int vocab) {
  const int B = 2, T = 8;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int s = 1; s <= steps; ++s) {
    for (int i = 0; i < B * T; ++i)
      in[size_t(i)] = (i * 7 + s) % vocab, tg[size_t(i)] = (i * 5 + s) % vocab;
    sw::Batch b;
    b.B = B, b.T = T, b.tokens = in.data(), b.targets = tg.data();
    sm.zero_grads();
    sm.forward_backward(b);
    sm.optimizer_step(sw::AdamWParams{}, 1e-2f, 1.f, s);
  }
}

// Every unit's held state of kind k (world size 1: all of it).
inline std::vector<std::vector<float>> state(const sw::ShardedModel& sm,
                                             sw::ShardedModel::StateKind k) {
  std::vector<std::vector<float>> r;
  for (int u = 0; u < sm.num_units(); ++u) {
    const sw::FlatRange h = sm.held_range(u, k);
    r.emplace_back(static_cast<size_t>(h.size()));
    sm.read_state(u, k, h, r.back().data());
  }
  return r;
}

inline bool bit_equal(const std::vector<std::vector<float>>& a,
                      const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

// Master, m and v all bit-equal.
inline bool same_state(const sw::ShardedModel& a, const sw::ShardedModel& b) {
  using SK = sw::ShardedModel::StateKind;
  for (SK k : {SK::Master, SK::ExpAvg, SK::ExpAvgSq})
    if (!bit_equal(state(a, k), state(b, k))) return false;
  return true;
}

}  // namespace ckpttest
