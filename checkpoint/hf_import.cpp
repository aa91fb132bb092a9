// Hugging Face model directories in: config.json -> ModelConfig, safetensors (single or
// sharded by an index) -> a ShardedModel, each rank reading only what it holds.
#include "checkpoint/hf_import.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/export.h"
#include "checkpoint/hf_layout.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "sharding/sharded_model.h"

namespace sw {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// config.json's keys, read with one-line errors naming the file and key.
struct Keys {
  const json& j;
  std::string file;
  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    fail("import", file + ": " + key + ": " + what);
  }
  bool given(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
  const json& need(const char* k) const {
    if (!given(k)) bad(k, "missing (required for " + arch() + ")");
    return j.at(k);
  }
  std::string arch() const { return j.at("architectures")[0].get<std::string>(); }
  int integer(const char* k, int lo) const {
    const json& v = need(k);
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > INT32_MAX)
      bad(k, "expected an integer >= " + std::to_string(lo) + ", got " + v.dump());
    return static_cast<int>(v.get<int64_t>());
  }
  int integer_or(const char* k, int lo, int def) const { return given(k) ? integer(k, lo) : def; }
  float positive(const char* k) const {
    const json& v = need(k);
    const double d = v.is_number() ? v.get<double>() : -1;
    if (!(d > 0) || !std::isfinite(static_cast<float>(d)))
      bad(k, "expected a positive number, got " + v.dump());
    return static_cast<float>(d);
  }
  float positive_or(const char* k, float def) const { return given(k) ? positive(k) : def; }
  bool boolean_or(const char* k, bool def) const {
    if (!given(k)) return def;
    if (!j.at(k).is_boolean()) bad(k, "expected true or false, got " + j.at(k).dump());
    return j.at(k).get<bool>();
  }
  std::string string_or(const char* k, const std::string& def) const {
    if (!given(k)) return def;
    if (!j.at(k).is_string()) bad(k, "expected a string, got " + j.at(k).dump());
    return j.at(k).get<std::string>();
  }
  // A key whose other values change the math: it must be absent, null or `ok`.
  template <class T>
  void only(const char* k, const T& ok, const std::string& why) const {
    if (given(k) && j.at(k) != json(ok))
      bad(k, j.at(k).dump() + " is not supported (" + why + ")");
  }
};

void read_gpt2(const Keys& k, ModelConfig& m) {
  m.type = "gpt2";
  m.d_model = k.integer("n_embd", 1);
  m.n_layer = k.integer("n_layer", 1);
  m.n_head = k.integer("n_head", 1);
  m.seq_len = k.integer("n_positions", 1);
  m.vocab_size = k.integer("vocab_size", 1);
  m.d_ff = 4 * m.d_model;
  if (k.given("n_inner") && k.integer("n_inner", 1) != m.d_ff)
    k.bad("n_inner", "must be null or 4 * n_embd (" + std::to_string(m.d_ff) + ")");
  const std::string act = k.string_or("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    k.bad("activation_function", "'" + act + "' is not supported (gelu_new, gelu_pytorch_tanh)");
  // Our LayerNorm's epsilon is fixed at 1e-5 (kernels/ops.h).
  const float eps = k.positive_or("layer_norm_epsilon", 1e-5f);
  if (std::fabs(eps - 1e-5f) > 1e-12f)
    k.bad("layer_norm_epsilon", std::to_string(eps) + " is not supported (GPT-2's 1e-5 only)");
  m.norm_eps = 1e-5f;
  k.only("scale_attn_weights", true, "attention is scaled by 1/sqrt(head dim)");
  k.only("scale_attn_by_inverse_layer_idx", false, "no per-layer attention scaling");
  k.only("add_cross_attention", false, "a decoder only");
  m.tie_embeddings = k.boolean_or("tie_word_embeddings", true);
  m.hf_architecture = "GPT2LMHeadModel";
}

void read_llama(const Keys& k, ModelConfig& m, HfConfig& out) {
  const std::string arch = k.arch();
  m.type = "llama";
  m.hf_architecture = arch;
  m.d_model = k.integer("hidden_size", 1);
  m.d_ff = k.integer("intermediate_size", 1);
  m.n_layer = k.integer("num_hidden_layers", 1);
  m.n_head = k.integer("num_attention_heads", 1);
  m.vocab_size = k.integer("vocab_size", 1);
  m.n_kv_head = k.integer_or("num_key_value_heads", 1, m.n_head);
  m.norm_eps = k.positive_or("rms_norm_eps", 1e-6f);
  m.rope_theta = k.positive_or("rope_theta", 10000.f);
  m.seq_len = k.integer_or("max_position_embeddings", 1, 2048);
  m.tie_embeddings = k.boolean_or("tie_word_embeddings", false);
  const std::string act = k.string_or("hidden_act", "silu");
  if (act != "silu") k.bad("hidden_act", "'" + act + "' is not supported (silu)");
  if (m.d_model % m.n_head != 0)
    k.bad("num_attention_heads", std::to_string(m.n_head) + " does not divide hidden_size " +
                                     std::to_string(m.d_model));
  if (k.given("head_dim") && k.integer("head_dim", 1) != m.d_model / m.n_head)
    k.bad("head_dim", std::to_string(k.integer("head_dim", 1)) +
                          " is not supported (only hidden_size / num_attention_heads = " +
                          std::to_string(m.d_model / m.n_head) + ")");
  if (arch != "Qwen2ForCausalLM") {
    k.only("attention_bias", false, "no attention biases in " + arch);
    k.only("mlp_bias", false, "no MLP biases");
  }
  k.only("pretraining_tp", 1, "the same math, but not implemented");
  m.qkv_bias = arch == "Qwen2ForCausalLM";
  // Sliding windows: Mistral's whenever sliding_window is set, Qwen2's when use_sliding_window.
  if (arch == "MistralForCausalLM" && k.given("sliding_window"))
    out.sliding_window = k.integer("sliding_window", 1);
  if (arch == "Qwen2ForCausalLM" && k.boolean_or("use_sliding_window", false))
    out.sliding_window = k.integer("sliding_window", 1);
  if (!k.given("rope_scaling")) return;
  const json& rs = k.j.at("rope_scaling");
  if (!rs.is_object()) k.bad("rope_scaling", "expected null or an object, got " + rs.dump());
  const char* tkey = rs.contains("rope_type") ? "rope_type" : "type";
  const std::string type =
      rs.contains(tkey) && rs.at(tkey).is_string() ? rs.at(tkey).get<std::string>() : "";
  if (type == "default") return;
  if (type != "llama3")
    k.bad(std::string("rope_scaling.") + tkey,
          (type.empty() ? std::string("missing") : "'" + type + "'") +
              " is not supported (null, default or llama3)");
  const Keys r{rs, k.file};
  auto sub = [](const char* key) { return std::string("rope_scaling.") + key; };
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor",
                          "original_max_position_embeddings"})
    if (!r.given(key)) k.bad(sub(key), "missing (required for llama3 scaling)");
  auto pos = [&](const char* key) {
    const json& v = rs.at(key);
    if (!v.is_number() || !(v.get<double>() > 0))
      k.bad(sub(key), "expected a positive number, got " + v.dump());
    return static_cast<float>(v.get<double>());
  };
  m.rope_scaling = "llama3";
  m.rope_factor = pos("factor");
  m.rope_low_freq_factor = pos("low_freq_factor");
  m.rope_high_freq_factor = pos("high_freq_factor");
  if (!(m.rope_high_freq_factor > m.rope_low_freq_factor))
    k.bad(sub("high_freq_factor"), "must exceed low_freq_factor");
  const json& omp = rs.at("original_max_position_embeddings");
  if (!omp.is_number_integer() || omp.get<int64_t>() < 1 || omp.get<int64_t>() > INT32_MAX)
    k.bad(sub("original_max_position_embeddings"),
          "expected a positive integer, got " + omp.dump());
  m.rope_original_max_pos = static_cast<int>(omp.get<int64_t>());
}

// ---- Weights --------------------------------------------------------------------------------

bool ends_with(const std::string& s, const char* suf) {
  const size_t n = std::char_traits<char>::length(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// Tensors HF checkpoints may carry that are not parameters: GPT-2's causal-mask buffers, old
// Llamas' RoPE frequencies.
bool is_hf_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
         ends_with(name, "rotary_emb.inv_freq");
}

std::string name_list(const std::vector<std::string>& names) {
  std::string r;
  const size_t show = std::min<size_t>(names.size(), 8);
  for (size_t i = 0; i < show; ++i) r += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > show) r += " and " + std::to_string(names.size() - show) + " more";
  return r;
}

// The files of a checkpoint: readers (headers only) and where each tensor lies.
struct WeightFiles {
  std::string where;  // the file or index named in errors
  std::vector<std::unique_ptr<SafeTensorsReader>> readers;
  std::map<std::string, const SafeTensorsReader*> tensor_file;

  explicit WeightFiles(const std::string& path) {
    std::error_code ec;
    std::string p = path;
    if (fs::is_directory(p, ec)) {
      const std::string index = (fs::path(p) / "model.safetensors.index.json").string();
      const std::string single = (fs::path(p) / "model.safetensors").string();
      if (fs::exists(index, ec))
        p = index;
      else if (fs::exists(single, ec))
        p = single;
      else
        fail("import", path + ": no model.safetensors or model.safetensors.index.json");
    }
    where = p;
    if (!ends_with(p, ".index.json")) {
      readers.push_back(std::make_unique<SafeTensorsReader>(p));
      for (const StTensorInfo& t : readers[0]->tensors()) tensor_file[t.name] = readers[0].get();
      return;
    }
    const json idx = read_json_file(p, "import");
    if (!idx.is_object() || !idx.contains("weight_map") || !idx.at("weight_map").is_object())
      fail("import", p + ": weight_map: missing (expected an object of tensor -> file)");
    const fs::path dir = fs::path(p).parent_path();
    std::map<std::string, const SafeTensorsReader*> by_file;
    for (auto it = idx.at("weight_map").begin(); it != idx.at("weight_map").end(); ++it) {
      if (!it.value().is_string())
        fail("import", p + ": weight_map." + it.key() + ": expected a file name, got " +
                           it.value().dump());
      const std::string f = it.value().get<std::string>();
      if (!by_file.count(f)) {
        const std::string fp = (dir / f).string();
        if (!fs::exists(fp, ec))
          fail("import", p + ": weight_map." + it.key() + ": file '" + f + "' does not exist");
        readers.push_back(std::make_unique<SafeTensorsReader>(fp));
        by_file[f] = readers.back().get();
      }
      const SafeTensorsReader* r = by_file[f];
      if (!r->find(it.key()))
        fail("import", p + ": weight_map." + it.key() + ": not in '" + f + "'");
      tensor_file[it.key()] = r;
    }
  }
};

}  // namespace

bool is_hf_model_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

HfConfig read_hf_config(const std::string& dir) {
  HfConfig out;
  out.file = (fs::path(dir) / "config.json").string();
  const json j = read_json_file(out.file, "import");
  if (!j.is_object()) fail("import", out.file + ": expected a JSON object");
  const Keys k{j, out.file};
  if (!j.contains("architectures") || !j.at("architectures").is_array() ||
      j.at("architectures").empty() || !j.at("architectures")[0].is_string())
    k.bad("architectures", "missing (expected e.g. [\"LlamaForCausalLM\"])");
  if (j.at("architectures").size() != 1)
    k.bad("architectures", "expected one entry, got " + j.at("architectures").dump());
  const std::string arch = k.arch();
  if (arch == "GPT2LMHeadModel")
    read_gpt2(k, out.model);
  else if (arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" || arch == "Qwen2ForCausalLM")
    read_llama(k, out.model, out);
  else
    k.bad("architectures", "'" + arch + "' is not supported (GPT2LMHeadModel, LlamaForCausalLM, "
                           "MistralForCausalLM, Qwen2ForCausalLM)");
  return out;
}

void check_hf_window(const HfConfig& c, int seq_len) {
  if (c.sliding_window > 0 && c.sliding_window < seq_len)
    fail("import", c.file + ": sliding_window: " + std::to_string(c.sliding_window) +
                       " is shorter than the run's model.seq_len " + std::to_string(seq_len) +
                       " (a sliding window is not implemented; use seq_len <= the window)");
}

void import_hf_weights(ShardedModel& model, const std::string& path, int* tensors_read) {
  const WeightFiles files(path);
  auto fail_import = [&](const std::string& msg) { fail("import", files.where + ": " + msg); };

  // The file name of each parameter, checked before anything is read or changed.
  struct Item {
    ParamSpec spec;
    std::string file_name;
    const SafeTensorsReader* reader = nullptr;
  };
  std::vector<Item> items;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> used;
  size_t expected = 0;
  const bool gpt2 = model.model().config.type == "gpt2";
  for (int u = 0; u < model.num_units(); ++u)
    for (const ParamSpec& s : model.logical_specs(u)) {  // (tensor parallelism: whole tensors)
      ++expected;
      std::string n = hf_file_name(s);
      auto it = files.tensor_file.find(n);
      if (it == files.tensor_file.end() && gpt2) {  // transformers' GPT2LMHeadModel
        it = files.tensor_file.find("transformer." + n);
        if (it != files.tensor_file.end()) n = "transformer." + n;
      }
      if (it == files.tensor_file.end()) {
        missing.push_back(hf_file_name(s));
        continue;
      }
      used.insert(n);
      const StTensorInfo& t = it->second->at(n);
      const Shape want = hf_file_shape(s);
      if (t.shape != want)
        mismatched.push_back("'" + n + "' is " + shape_str(t.shape) + ", the model expects " +
                             shape_str(want));
      else if (t.dtype != StDType::F32 && t.dtype != StDType::BF16 && t.dtype != StDType::F16)
        mismatched.push_back("'" + n + "' has dtype " + st_dtype_name(t.dtype) +
                             " (expected F32, BF16 or F16)");
      items.push_back({s, n, it->second});
    }
  if (!missing.empty())
    fail_import("missing " + std::to_string(missing.size()) + " of " + std::to_string(expected) +
                " tensors: " + name_list(missing));
  if (!mismatched.empty()) {
    std::string m = "tensor " + mismatched[0];
    if (mismatched.size() > 1)
      m += " (and " + std::to_string(mismatched.size() - 1) + " more mismatched tensors)";
    fail_import(m);
  }
  // Anything else in the files is a mistake (another model), except buffers and a tied head's
  // copy of the embedding that some writers keep.
  // A pipeline stage holds some units: the other stages' tensors are the whole model's others.
  const bool tied = model.model().config.tied();
  bool check_unknown = true;
  if (model.model().stage.split()) try {
      for (const auto& u : build_model(model.model().config).units)
        for (const ParamSpec& s : u->params())
          for (const std::string& n : {hf_file_name(s), "transformer." + hf_file_name(s)})
            if (files.tensor_file.count(n)) used.insert(n);
    } catch (const Error&) {  // a custom model's config: the stage cannot tell
      check_unknown = false;
    }
  std::vector<std::string> unknown;
  for (const auto& [name, r] : files.tensor_file)
    if (check_unknown && !used.count(name) && !is_hf_buffer(name) &&
        !(tied && name == "lm_head.weight"))
      unknown.push_back(name);
  if (!unknown.empty()) fail_import("unexpected tensors not in the model: " + name_list(unknown));

  // One tensor at a time, only those this rank keeps part of. HF's Conv1D weights (GPT-2),
  // stored (in, out), are read a block of rows at a time and scattered transposed, so no
  // second full-size buffer is needed.
  std::vector<float> rows;
  int read = 0;
  for (const Item& it : items) {
    if (!model.holds_param(it.spec.name)) continue;
    ++read;
    const int64_t n = numel(it.spec.shape);
    std::vector<float> buf(static_cast<size_t>(n));  // freed before the next one is made
    if (!it.spec.hf_transpose) {
      it.reader->read_f32(it.file_name, buf.data());
    } else {
      const int64_t out = it.spec.shape[0], in = it.spec.shape[1];  // ours (out, in)
      constexpr int64_t kRows = 64;
      rows.resize(static_cast<size_t>(std::min(in, kRows) * out));
      for (int64_t i0 = 0; i0 < in; i0 += kRows) {
        const int64_t k = std::min(kRows, in - i0);
        it.reader->read_f32(it.file_name, rows.data(), i0 * out, k * out);
        for (int64_t i = 0; i < k; ++i)
          for (int64_t o = 0; o < out; ++o)
            buf[static_cast<size_t>(o * in + i0 + i)] = rows[static_cast<size_t>(i * out + o)];
      }
    }
    model.set_param(it.spec.name, buf.data(), n);
  }
  if (tensors_read) *tensors_read = read;
}

}  // namespace sw
