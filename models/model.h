// A model: its units and the order they run in. GPT-2 and Llama-style models are built from
// a ModelConfig; users build their own by subclassing Unit (see examples/).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "models/unit.h"

namespace sw {

struct ModelConfig {
  std::string type = "gpt2";  // gpt2 | llama
  int vocab_size = 256;
  int n_layer = 4;
  int n_head = 4;
  int n_kv_head = 0;  // llama; 0 = n_head
  int d_model = 128;
  int d_ff = 0;       // llama; 0 = the usual 8/3*d rounded up to a multiple of 64 (gpt2: 4*d)
  int seq_len = 128;  // maximum context (gpt2: positions table size)
  float rope_theta = 10000.f;
  float norm_eps = 1e-5f;
  bool tie_embeddings = true;  // gpt2 only
};

struct Call {
  int unit = 0;  // index into Model::units
  int call = 0;  // which of that unit's calls
};

class Model {
 public:
  ModelConfig config;
  std::vector<std::unique_ptr<Unit>> units;
  std::vector<Call> schedule;  // forward order; backward runs it in reverse
  int d_model() const { return config.d_model; }
  int64_t num_params() const;  // sum over units, tied weights counted once
};

// Builds GPT-2 or Llama from the config (throws sw::Error naming the bad field).
Model build_model(const ModelConfig& cfg);

}  // namespace sw
