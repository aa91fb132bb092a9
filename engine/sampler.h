// Text generation from a trained model: the prompt encoded and the continuation decoded with
// the run's tokenizer (bytes when none is given); temperature 0 is greedy; top_k 0 = no top-k
// filter. Generation stops early at the tokenizer's end-of-text id (not written out).
// Deterministic for a given seed.
#pragma once
#include <cstdint>
#include <string>

namespace sw {

class ShardedModel;
class Tokenizer;

struct SampleOptions {
  std::string prompt;
  int tokens = 200;
  float temperature = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  // The run's tokenizer (engine/tokenizer.h; data.tokenizer); nullptr = bytes, as before: ids
  // < 256 are written as bytes, larger ones as "<|id|>".
  const Tokenizer* tokenizer = nullptr;
};

// Returns the generated continuation (without the prompt). The context window slides when the
// text grows past the model's seq_len. With a tokenizer, an empty prompt starts from its bos
// id (else its end-of-text id, else token 0), and an id the model may produce beyond the
// tokenizer's vocabulary (a padded embedding) is written as "<|id|>".
std::string sample_text(ShardedModel& model, const SampleOptions& opts);

}  // namespace sw
