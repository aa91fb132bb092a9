// Hugging Face names and layouts of parameters, shared by the consolidated export of a live
// model (export.cpp) and the streaming export of a checkpoint (sharded_checkpoint.cpp), so
// both write byte-identical files. Internal to checkpoint/.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "models/model.h"

namespace sw {

// The name a parameter is exported under (hf_name, or its own name when empty).
const std::string& hf_file_name(const ParamSpec& s);
// The shape stored in the file: HF's Conv1D keeps (in, out) where we keep (out, in).
Shape hf_file_shape(const ParamSpec& s);
// dst(cols, rows) = src(rows, cols)^T.
void transpose_f32(float* dst, const float* src, int64_t rows, int64_t cols);

// Every ModelConfig field, in declaration order, and back (throws sw::Error("<component>: ...")
// naming a missing or mistyped key).
nlohmann::ordered_json model_config_to_json(const ModelConfig& c);
// any_type: a model of the user's own units (its config's type is theirs, e.g. "custom"): any
// non-empty type is read back (a sharded checkpoint's metadata); otherwise gpt2 or llama.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where,
                                   bool any_type = false);
// A JSON file other people make (config.json, an index, tokenizer.json): read, refused past
// kJsonMaxDepth (core/json_depth.h) before parsing, parsed; failures are sw::Error
// "<component>: <path>: ..." on one line.
nlohmann::json read_json_file(const std::string& path, const char* component);
// The safetensors __metadata__ of an HF export of a model with config `c`.
std::map<std::string, std::string> hf_export_metadata(const ModelConfig& c);

}  // namespace sw
