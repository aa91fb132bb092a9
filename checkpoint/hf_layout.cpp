#include "checkpoint/hf_layout.h"

#include <algorithm>

#include "core/error.h"

namespace sw {

const std::string& hf_file_name(const ParamSpec& s) { return s.hf_name.empty() ? s.name : s.hf_name; }

Shape hf_file_shape(const ParamSpec& s) {
  if (!s.hf_transpose) return s.shape;
  SW_CHECK(s.shape.size() == 2, "hf_transpose on a parameter that is not a matrix: " + s.name);
  return {s.shape[1], s.shape[0]};
}

void transpose_f32(float* dst, const float* src, int64_t rows, int64_t cols) {
  constexpr int64_t kT = 32;  // cache-friendly tiles
  for (int64_t r0 = 0; r0 < rows; r0 += kT)
    for (int64_t c0 = 0; c0 < cols; c0 += kT)
      for (int64_t r = r0; r < std::min(rows, r0 + kT); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kT); ++c) dst[c * rows + r] = src[r * cols + c];
}

nlohmann::ordered_json model_config_to_json(const ModelConfig& c) {
  return {
      {"type", c.type},
      {"vocab_size", c.vocab_size},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_kv_head", c.n_kv_head},
      {"d_model", c.d_model},
      {"d_ff", c.d_ff},
      {"seq_len", c.seq_len},
      {"rope_theta", c.rope_theta},
      {"norm_eps", c.norm_eps},
      {"tie_embeddings", c.tie_embeddings},
  };
}

ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where) {
  ModelConfig c;
  auto get = [&](const char* k, auto& v) {
    if (!j.is_object() || !j.contains(k)) fail("checkpoint", where + ": model_config has no '" + k + "'");
    try {
      j.at(k).get_to(v);
    } catch (const std::exception&) {
      fail("checkpoint", where + ": model_config." + k + " has the wrong type");
    }
  };
  get("type", c.type);
  get("vocab_size", c.vocab_size);
  get("n_layer", c.n_layer);
  get("n_head", c.n_head);
  get("n_kv_head", c.n_kv_head);
  get("d_model", c.d_model);
  get("d_ff", c.d_ff);
  get("seq_len", c.seq_len);
  get("rope_theta", c.rope_theta);
  get("norm_eps", c.norm_eps);
  get("tie_embeddings", c.tie_embeddings);
  return c;
}

std::map<std::string, std::string> hf_export_metadata(const ModelConfig& c) {
  return {
      {"format", "pt"},  // what Hugging Face's loaders check for
      {"producer", "shardwise"},
      {"model_config", model_config_to_json(c).dump()},
  };
}

}  // namespace sw
