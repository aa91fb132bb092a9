// Importing a Hugging Face model directory (what transformers' save_pretrained writes):
// config.json into a ModelConfig, and the weights from model.safetensors or a sharded
// model.safetensors.index.json into a ShardedModel, each rank reading only the tensors it holds
// part of. Errors are one line naming the file and the key (or tensor).
#pragma once
#include <string>
#include <vector>

#include "models/model.h"

namespace sw {

class ShardedModel;

// True when `path` is a directory holding config.json.
bool is_hf_model_dir(const std::string& path);

// config.json read into our model block. Architectures: GPT2LMHeadModel, LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM (hf_architecture records which). seq_len is the
// config's max_position_embeddings (GPT-2: n_positions). Keys that do not change the math
// (torch_dtype, token ids, initializer_range, use_cache, ...) are ignored; an unsupported
// architecture, a missing required key, or a value whose math Shardwise does not implement is
// an sw::Error "import: DIR/config.json: <key>: <problem>".
struct HfConfig {
  ModelConfig model;
  int sliding_window = 0;  // Mistral / Qwen2 with a sliding window on; 0 = off
  std::string file;        // DIR/config.json
};
HfConfig read_hf_config(const std::string& dir);
// A sliding window shorter than the run's seq_len changes the attention: refused, naming
// config.json's key.
void check_hf_window(const HfConfig& c, int seq_len);

// The weights' files of `path`: a safetensors file, a model.safetensors.index.json, or a
// directory holding either (the index preferred). Loads every parameter of `model` (F32, BF16
// or F16 in the file; GPT-2 names with or without "transformer."; a tied LM head absent from the
// file; GPT-2's attn.bias / attn.masked_bias buffers skipped). Every rank checks the headers
// of all tensors first (nothing is changed on an error), then reads, one tensor at a time,
// only those it holds part of (ShardedModel::holds_param): the import holds at most one
// tensor (fp32) beyond the rank's shards. No collective. `tensors_read`, when given, receives
// how many tensors this rank read.
void import_hf_weights(ShardedModel& model, const std::string& path,
                       int* tensors_read = nullptr);

}  // namespace sw
