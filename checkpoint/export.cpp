// Hugging Face-style safetensors export and import of a ShardedModel's full parameters.
#include "checkpoint/export.h"

#include <set>
#include <vector>

#include "checkpoint/hf_import.h"
#include "checkpoint/hf_layout.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "sharding/sharded_model.h"

namespace sw {

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
  import_hf_weights(model, path);  // a file, an index or a directory (checkpoint/hf_import.h)
}

}  // namespace sw
