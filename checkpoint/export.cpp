// Hugging Face-style safetensors export and import of a ShardedModel's full parameters.
#include "checkpoint/export.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "sharding/sharded_model.h"

namespace sw {

namespace {

const std::string& file_name(const ParamSpec& s) { return s.hf_name.empty() ? s.name : s.hf_name; }

// The shape stored in the file: HF's Conv1D keeps (in, out) where we keep (out, in).
Shape file_shape(const ParamSpec& s) {
  if (!s.hf_transpose) return s.shape;
  SW_CHECK(s.shape.size() == 2, "hf_transpose on a parameter that is not a matrix: " + s.name);
  return {s.shape[1], s.shape[0]};
}

// dst(cols, rows) = src(rows, cols)^T, in cache-friendly tiles.
void transpose(float* dst, const float* src, int64_t rows, int64_t cols) {
  constexpr int64_t kT = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kT)
    for (int64_t c0 = 0; c0 < cols; c0 += kT)
      for (int64_t r = r0; r < std::min(rows, r0 + kT); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kT); ++c)
          dst[c * rows + r] = src[r * cols + c];
}

std::string config_json(const ModelConfig& c) {
  nlohmann::ordered_json j = {
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
  return j.dump();
}

// Tensors that HF GPT-2 checkpoints carry but that are not parameters (the causal-mask
// buffers).
bool is_hf_buffer(const std::string& name) {
  auto ends_with = [&](const char* suf) {
    const size_t n = std::char_traits<char>::length(suf);
    return name.size() >= n && name.compare(name.size() - n, n, suf) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

std::string name_list(const std::vector<std::string>& names) {
  std::string r;
  const size_t show = std::min<size_t>(names.size(), 8);
  for (size_t i = 0; i < show; ++i) r += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > show) r += " and " + std::to_string(names.size() - show) + " more";
  return r;
}

}  // namespace

void export_hf_safetensors(const ShardedModel& model, const std::string& path) {
  // Pass 1: the table of contents (the header needs every shape before any data).
  std::vector<StTensorDesc> descs;
  std::set<std::string> seen;
  model.for_each_param([&](const ParamSpec& s, const float*) {
    const std::string& n = file_name(s);
    if (!seen.insert(n).second)
      fail("export", path + ": two parameters export to the same name '" + n + "'");
    descs.push_back({n, StDType::F32, file_shape(s)});
  });
  std::map<std::string, std::string> meta = {
      {"format", "pt"},  // what Hugging Face's loaders check for
      {"producer", "shardwise"},
      // ShardedModel::model() has no const overload; reading the config modifies nothing.
      {"model_config", config_json(const_cast<ShardedModel&>(model).model().config)},
  };
  // Pass 2: stream the data, transposing HF Conv1D weights through one temporary.
  SafeTensorsWriter w(path, std::move(descs), meta);
  std::vector<float> tmp;
  model.for_each_param([&](const ParamSpec& s, const float* data) {
    if (!s.hf_transpose) {
      w.write_tensor(file_name(s), data);
      return;
    }
    tmp.resize(static_cast<size_t>(numel(s.shape)));
    transpose(tmp.data(), data, s.shape[0], s.shape[1]);
    w.write_tensor(file_name(s), tmp.data());
  });
  w.finish();
}

void import_safetensors(ShardedModel& model, const std::string& path) {
  SafeTensorsReader r(path);
  auto fail_import = [&](const std::string& msg) { fail("import", path + ": " + msg); };

  // Check everything before touching the model, so a bad file leaves it unchanged.
  struct Item {
    ParamSpec spec;
    std::string file_name;
  };
  std::vector<Item> items;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> expected;
  model.for_each_param([&](const ParamSpec& s, const float*) {
    const std::string& n = file_name(s);
    expected.insert(n);
    const StTensorInfo* t = r.find(n);
    if (!t) {
      missing.push_back(n);
      return;
    }
    const Shape want = file_shape(s);
    if (t->shape != want)
      mismatched.push_back("'" + n + "' is " + shape_str(t->shape) + ", the model expects " +
                           shape_str(want));
    else if (t->dtype != StDType::F32 && t->dtype != StDType::BF16 && t->dtype != StDType::F16)
      mismatched.push_back("'" + n + "' has dtype " + st_dtype_name(t->dtype) +
                           " (expected F32, BF16 or F16)");
    items.push_back({s, n});
  });
  if (!missing.empty())
    fail_import("missing " + std::to_string(missing.size()) + " of " +
                std::to_string(expected.size()) + " tensors: " + name_list(missing));
  if (!mismatched.empty()) {
    std::string m = "tensor " + mismatched[0];
    if (mismatched.size() > 1)
      m += " (and " + std::to_string(mismatched.size() - 1) + " more mismatched tensors)";
    fail_import(m);
  }
  std::vector<std::string> unknown;
  for (const StTensorInfo& t : r.tensors())
    if (!expected.count(t.name) && !is_hf_buffer(t.name)) unknown.push_back(t.name);
  if (!unknown.empty()) fail_import("unexpected tensors not in the model: " + name_list(unknown));

  std::vector<float> buf, tmp;
  for (const Item& it : items) {
    const int64_t n = numel(it.spec.shape);
    buf.resize(static_cast<size_t>(n));
    r.read_f32(it.file_name, buf.data());
    if (it.spec.hf_transpose) {
      tmp.resize(buf.size());
      // The file holds (in, out) = (shape[1], shape[0]); ours is (out, in).
      transpose(tmp.data(), buf.data(), it.spec.shape[1], it.spec.shape[0]);
      buf.swap(tmp);
    }
    model.set_param(it.spec.name, buf.data(), n);
  }
}

}  // namespace sw
