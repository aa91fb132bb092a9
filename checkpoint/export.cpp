// Hugging Face-style safetensors export and import of a ShardedModel's full parameters.
#include "checkpoint/export.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "checkpoint/hf_layout.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "sharding/sharded_model.h"

namespace sw {

namespace {

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
    const std::string& n = hf_file_name(s);
    if (!seen.insert(n).second)
      fail("export", path + ": two parameters export to the same name '" + n + "'");
    descs.push_back({n, StDType::F32, hf_file_shape(s)});
  });
  // ShardedModel::model() has no const overload; reading the config modifies nothing.
  const auto meta = hf_export_metadata(const_cast<ShardedModel&>(model).model().config);
  // Pass 2: stream the data, transposing HF Conv1D weights through one temporary.
  SafeTensorsWriter w(path, std::move(descs), meta);
  std::vector<float> tmp;
  model.for_each_param([&](const ParamSpec& s, const float* data) {
    if (!s.hf_transpose) {
      w.write_tensor(hf_file_name(s), data);
      return;
    }
    tmp.resize(static_cast<size_t>(numel(s.shape)));
    transpose_f32(tmp.data(), data, s.shape[0], s.shape[1]);
    w.write_tensor(hf_file_name(s), tmp.data());
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
    const std::string& n = hf_file_name(s);
    expected.insert(n);
    const StTensorInfo* t = r.find(n);
    if (!t) {
      missing.push_back(n);
      return;
    }
    const Shape want = hf_file_shape(s);
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
      transpose_f32(tmp.data(), buf.data(), it.spec.shape[1], it.spec.shape[0]);
      buf.swap(tmp);
    }
    model.set_param(it.spec.name, buf.data(), n);
  }
}

}  // namespace sw
