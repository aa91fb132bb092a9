// Text generation from a trained model (byte-level tokens): temperature 0 is greedy;
// top_k 0 = no top-k filter. Deterministic for a given seed.
#pragma once
#include <cstdint>
#include <string>

namespace sw {

class ShardedModel;

struct SampleOptions {
  std::string prompt;
  int tokens = 200;
  float temperature = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
};

// Returns the generated continuation (without the prompt). The context window slides when the
// text grows past the model's seq_len.
std::string sample_text(ShardedModel& model, const SampleOptions& opts);

}  // namespace sw
