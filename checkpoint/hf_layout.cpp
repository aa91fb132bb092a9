#include "checkpoint/hf_layout.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json_depth.h"

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
      {"tie_embeddings", c.tied()},
      {"qkv_bias", c.qkv_bias},
      {"rope_scaling", c.rope_scaling},
      {"rope_factor", c.rope_factor},
      {"rope_low_freq_factor", c.rope_low_freq_factor},
      {"rope_high_freq_factor", c.rope_high_freq_factor},
      {"rope_original_max_pos", c.rope_original_max_pos},
      {"hf_architecture", c.hf_architecture},
  };
}

ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where,
                                   bool any_type) {
  ModelConfig c;
  auto bad = [&](const std::string& k, const std::string& what) {
    fail("checkpoint", where + ": model_config." + k + " " + what);
  };
  auto get = [&](const char* k) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(k)) fail("checkpoint", where + ": model_config has no '" + k + "'");
    return j.at(k);
  };
  // Integers are taken only when they fit the field and mean something: 2^40 is not 0.
  auto integer = [&](const char* k, int lo, int hi) {
    const nlohmann::json& v = get(k);
    const bool in = (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(hi)) ||
                    (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= lo &&
                     v.get<int64_t>() <= hi);
    if (!in || (v.is_number_unsigned() && static_cast<int64_t>(v.get<uint64_t>()) < lo))
      bad(k, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (got " +
                 v.dump() + ")");
    return static_cast<int>(v.get<int64_t>());
  };
  // Positive finite numbers that survive the conversion to float.
  auto positive = [&](const char* k) {
    const nlohmann::json& v = get(k);
    const double d = v.is_number() ? v.get<double>() : -1;
    const float f = static_cast<float>(d);
    if (!(d > 0) || !std::isfinite(f) || f == 0)
      bad(k, "must be a positive number within float's range (got " + v.dump() + ")");
    return f;
  };
  const nlohmann::json& type = get("type");
  const bool builtin = type.is_string() && (type == "gpt2" || type == "llama");
  if (!builtin && !(any_type && type.is_string() && !type.get<std::string>().empty() &&
                    type.get<std::string>().size() <= 64))
    bad("type", std::string(any_type ? "must be a model type name" : "must be \"gpt2\" or \"llama\"") +
                    " (got " + type.dump() + ")");
  c.type = type.get<std::string>();
  c.vocab_size = integer("vocab_size", 1, 65536);  // tokens are uint16
  c.n_layer = integer("n_layer", 1, INT32_MAX);
  c.n_head = integer("n_head", 1, INT32_MAX);
  c.n_kv_head = integer("n_kv_head", 0, INT32_MAX);
  c.d_model = integer("d_model", 1, INT32_MAX);
  c.d_ff = integer("d_ff", 0, INT32_MAX);
  c.seq_len = integer("seq_len", 1, INT32_MAX);
  c.rope_theta = positive("rope_theta");
  c.norm_eps = positive("norm_eps");
  const nlohmann::json& tie = get("tie_embeddings");
  if (!tie.is_boolean()) bad("tie_embeddings", "must be true or false (got " + tie.dump() + ")");
  c.tie_embeddings = tie.get<bool>();
  // The Llama variants' fields (issue 35). Files from before them have none: their llama
  // models were untied whatever tie_embeddings said (it was ignored), and plain RoPE.
  if (!j.contains("qkv_bias")) {
    if (c.type == "llama") c.tie_embeddings = false;
  } else {
    const nlohmann::json& qb = get("qkv_bias");
    if (!qb.is_boolean()) bad("qkv_bias", "must be true or false (got " + qb.dump() + ")");
    c.qkv_bias = qb.get<bool>();
    const nlohmann::json& rs = get("rope_scaling");
    if (!rs.is_string() || (rs != "none" && rs != "llama3"))
      bad("rope_scaling", "must be \"none\" or \"llama3\" (got " + rs.dump() + ")");
    c.rope_scaling = rs.get<std::string>();
    c.rope_factor = positive("rope_factor");
    c.rope_low_freq_factor = positive("rope_low_freq_factor");
    c.rope_high_freq_factor = positive("rope_high_freq_factor");
    c.rope_original_max_pos = integer("rope_original_max_pos", 1, INT32_MAX);
    const nlohmann::json& arch = get("hf_architecture");
    if (!arch.is_string()) bad("hf_architecture", "must be a string (got " + arch.dump() + ")");
    c.hf_architecture = arch.get<std::string>();
  }
  if (c.d_model % c.n_head)
    bad("d_model", "(" + std::to_string(c.d_model) + ") is not a multiple of n_head (" +
                       std::to_string(c.n_head) + ")");
  if (c.n_kv_head > 0 && c.n_head % c.n_kv_head)
    bad("n_kv_head", "(" + std::to_string(c.n_kv_head) + ") does not divide n_head (" +
                         std::to_string(c.n_head) + ")");
  return c;
}

std::map<std::string, std::string> hf_export_metadata(const ModelConfig& c) {
  return {
      {"format", "pt"},  // what Hugging Face's loaders check for
      {"producer", "shardwise"},
      {"model_config", model_config_to_json(c).dump()},
  };
}

nlohmann::json read_json_file(const std::string& path, const char* component) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(component, path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  if (const size_t at = json_depth_exceeded(text); at != std::string::npos)
    fail(component, path + ": nested deeper than " + std::to_string(kJsonMaxDepth) +
                        " levels at " + json_position(text, at));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(component, path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

}  // namespace sw
