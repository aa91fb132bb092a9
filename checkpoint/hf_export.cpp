// Hugging Face model directories out (hf_export.h): config.json, weights cut into files by size
// and written by the ranks that own them, the index and the tokenizer's files.
#include "checkpoint/hf_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "checkpoint/file_io.h"
#include "checkpoint/hf_layout.h"
#include "core/error.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"

namespace sw {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// The architecture a config exports as, checked against what it can hold.
std::string architecture(const ModelConfig& c, const std::string& where) {
  auto bad = [&](const std::string& key, const std::string& what) {
    fail("export", where + ": model." + key + ": " + what);
  };
  std::string a = c.hf_architecture;
  if (c.type == "gpt2") {
    if (a.empty()) a = "GPT2LMHeadModel";
    if (a != "GPT2LMHeadModel")
      bad("hf_architecture", "'" + a + "' is not a GPT-2 architecture (GPT2LMHeadModel)");
    return a;
  }
  if (c.type != "llama") bad("type", "'" + c.type + "' has no Hugging Face architecture");
  if (a.empty()) a = c.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  if (a != "LlamaForCausalLM" && a != "MistralForCausalLM" && a != "Qwen2ForCausalLM")
    bad("hf_architecture", "'" + a +
                               "' is not one of LlamaForCausalLM, MistralForCausalLM, "
                               "Qwen2ForCausalLM");
  // Llama's attention_bias would add an o_proj bias too; Qwen2 always has the q/k/v biases.
  if (c.qkv_bias && a != "Qwen2ForCausalLM")
    bad("qkv_bias", "q/k/v biases export only as Qwen2ForCausalLM (hf_architecture is " + a + ")");
  if (!c.qkv_bias && a == "Qwen2ForCausalLM")
    bad("qkv_bias", "Qwen2ForCausalLM has q/k/v biases; the model has none");
  if (c.rope_scaling != "none" && a == "MistralForCausalLM")
    bad("rope_scaling", "MistralForCausalLM takes no rope_scaling in transformers 4.46");
  return a;
}

void copy_into(const std::string& src, const std::string& dst) {
  std::error_code ec;
  fs::copy_file(src, dst, fs::copy_options::overwrite_existing, ec);
  if (ec) fail("export", src + ": cannot copy to " + dst + " (" + ec.message() + ")");
}

// A special token of tokenizer.json's added_tokens whose content is one of `names`, or null.
const nlohmann::json* special_token(const nlohmann::json& tok,
                                   std::initializer_list<const char*> names) {
  if (!tok.contains("added_tokens") || !tok["added_tokens"].is_array()) return nullptr;
  for (const char* n : names)
    for (const nlohmann::json& t : tok["added_tokens"])
      if (t.is_object() && t.value("special", false) && t.value("content", std::string()) == n &&
          t.contains("id") && t["id"].is_number_integer())
        return &t;
  return nullptr;
}

// The run's tokenizer files into dir, with what AutoTokenizer needs beside them; the special
// tokens' ids go into config.json (bos_token_id, eos_token_id).
void write_tokenizer(const std::string& dir, const std::string& tokenizer, int max_len,
                     ojson& config) {
  if (tokenizer.empty() || tokenizer == "bytes") return;  // no Hugging Face equivalent
  std::string src = tokenizer, src_dir;
  std::error_code ec;
  if (fs::is_directory(tokenizer, ec)) {
    src_dir = tokenizer;
    src = fs::exists(tokenizer + "/tokenizer.json", ec) ? tokenizer + "/tokenizer.json"
                                                        : tokenizer + "/tokenizer.model";
  }
  if (!fs::is_regular_file(src, ec))
    fail("export", "data.tokenizer: '" + src + "': no such file (the tokenizer the run used)");
  const bool json_tok = ends_with(src, ".json");
  if (!json_tok && !ends_with(src, ".model"))
    fail("export", "data.tokenizer: '" + src + "': neither a tokenizer.json nor a .model file");
  copy_into(src, dir + (json_tok ? "/tokenizer.json" : "/tokenizer.model"));
  // The user's own Hugging Face tokenizer files, where the tokenizer came as a directory.
  bool have_config = false;
  for (const char* f : {"tokenizer_config.json", "special_tokens_map.json"})
    if (!src_dir.empty() && fs::is_regular_file(src_dir + "/" + f, ec)) {
      copy_into(src_dir + "/" + f, dir + "/" + f);
      have_config |= std::string(f) == "tokenizer_config.json";
    }
  ojson tc, special;
  if (json_tok) {
    const nlohmann::json tok = read_json_file(src, "export");
    const nlohmann::json* eos =
        special_token(tok, {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>", "<eos>"});
    const nlohmann::json* bos = special_token(tok, {"<|begin_of_text|>", "<s>", "<bos>"});
    if (!bos && config["model_type"] == "gpt2") bos = eos;  // GPT-2's one special token
    tc["tokenizer_class"] = "PreTrainedTokenizerFast";
    if (bos) {
      special["bos_token"] = (*bos)["content"];
      config["bos_token_id"] = (*bos)["id"];
    }
    if (eos) {
      special["eos_token"] = (*eos)["content"];
      config["eos_token_id"] = (*eos)["id"];
    }
  } else {
    // SentencePiece (Llama 2): LlamaTokenizer's own special tokens; legacy = plain
    // SentencePieceProcessor.encode, as Shardwise's tokenizer encodes.
    tc["tokenizer_class"] = "LlamaTokenizer";
    special = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};
    tc["add_bos_token"] = true;
    tc["add_eos_token"] = false;
    tc["legacy"] = true;
  }
  if (have_config) return;
  for (auto& [k, v] : special.items()) tc[k] = v;
  tc["model_max_length"] = max_len;
  tc["clean_up_tokenization_spaces"] = false;
  write_file_synced(dir + "/tokenizer_config.json", tc.dump(2) + "\n");
  if (!special.empty()) write_file_synced(dir + "/special_tokens_map.json", special.dump(2) + "\n");
}

// A float as the shortest decimal that reads back as it (1e-05, not 9.99999974e-06).
double fnum(float f) {
  char b[32];
  for (int prec = 6; prec <= 9; ++prec) {
    std::snprintf(b, sizeof b, "%.*g", prec, static_cast<double>(f));
    if (std::strtof(b, nullptr) == f) break;
  }
  return std::strtod(b, nullptr);
}

}  // namespace

bool any_rank(Group& g, bool v) {
  float f = v ? 1.f : 0.f, out = 0;
  g.all_reduce(&f, &out, 1, ReduceOp::Max);
  return out > 0;
}

std::vector<std::string> all_gather_strings(Group& g, const std::string& mine) {
  // Raw all-gathers of the lengths, then of the bytes padded to the longest.
  const int W = g.size();
  if (W == 1) return {mine};
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(W));
  g.all_gather(&len, lens.data(), 2, DType::F32);  // 8 bytes as two 4-byte words
  const int64_t maxlen = *std::max_element(lens.begin(), lens.end());
  const int64_t words = std::max<int64_t>((maxlen + 3) / 4, 1);
  std::vector<char> send(static_cast<size_t>(words * 4), 0), recv(send.size() * static_cast<size_t>(W));
  std::memcpy(send.data(), mine.data(), mine.size());
  g.all_gather(send.data(), recv.data(), words, DType::F32);
  std::vector<std::string> out;
  for (int r = 0; r < W; ++r)
    out.emplace_back(recv.data() + send.size() * static_cast<size_t>(r),
                     static_cast<size_t>(lens[static_cast<size_t>(r)]));
  return out;
}

ojson hf_config_json(const ModelConfig& c, const std::string& where) {
  const std::string arch = architecture(c, where);
  ojson j;
  j["architectures"] = ojson::array({arch});
  if (c.type == "gpt2") {
    j["model_type"] = "gpt2";
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.seq_len;
    j["n_ctx"] = c.seq_len;
    j["n_embd"] = c.d_model;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = c.d_ff > 0 ? c.d_ff : 4 * c.d_model;
    j["activation_function"] = "gelu_new";  // the tanh approximation (kernels' gelu)
    j["layer_norm_epsilon"] = fnum(c.norm_eps);
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["initializer_range"] = 0.02;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
  } else {
    j["model_type"] = arch == "Qwen2ForCausalLM"     ? "qwen2"
                      : arch == "MistralForCausalLM" ? "mistral"
                                                     : "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.d_model;
    j["intermediate_size"] = c.d_ff;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_kv_head > 0 ? c.n_kv_head : c.n_head;
    j["head_dim"] = c.d_model / c.n_head;
    j["max_position_embeddings"] = c.seq_len;
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = fnum(c.norm_eps);
    j["rope_theta"] = fnum(c.rope_theta);
    if (c.rope_scaling == "llama3")
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", fnum(c.rope_factor)},
                           {"low_freq_factor", fnum(c.rope_low_freq_factor)},
                           {"high_freq_factor", fnum(c.rope_high_freq_factor)},
                           {"original_max_position_embeddings", c.rope_original_max_pos}};
    else if (c.rope_scaling == "none")
      j["rope_scaling"] = nullptr;
    else
      fail("export", where + ": model.rope_scaling: '" + c.rope_scaling +
                         "' is not \"none\" or \"llama3\"");
    if (arch == "LlamaForCausalLM") {
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
      j["pretraining_tp"] = 1;
    } else {
      j["sliding_window"] = nullptr;
      if (arch == "Qwen2ForCausalLM") j["use_sliding_window"] = false;
    }
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = 0.02;
  }
  j["tie_word_embeddings"] = c.tied();
  j["torch_dtype"] = "float32";
  j["use_cache"] = true;
  return j;
}

std::string hf_dir_tensor_name(const ModelConfig& c, const std::string& hf_name) {
  if (c.type == "gpt2" && !c.tied() && hf_name != "lm_head.weight")
    return "transformer." + hf_name;
  return hf_name;
}

HfShardPlan plan_hf_shards(std::vector<StTensorDesc> tensors, int64_t max_shard_bytes) {
  SW_CHECK(max_shard_bytes > 0, "plan_hf_shards: max_shard_bytes must be positive");
  HfShardPlan p;
  const uint64_t cap = static_cast<uint64_t>(max_shard_bytes);
  uint64_t cur = 0;
  int n = 0;
  for (const StTensorDesc& t : tensors) {
    const uint64_t b = static_cast<uint64_t>(numel(t.shape)) * st_dtype_size(t.dtype);
    if (n == 0 || (cur > 0 && cur + b > cap)) {
      p.first.push_back(p.file_of.size());
      ++n;
      cur = 0;
    }
    p.file_of.push_back(n - 1);
    cur += b;
    p.total_size += b;
  }
  p.tensors = std::move(tensors);
  char name[64];
  for (int f = 0; f < n; ++f) {
    if (n == 1) {
      p.files.push_back("model.safetensors");
      break;
    }
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, n);
    p.files.push_back(name);
  }
  return p;
}

HfShardWriter::HfShardWriter(const std::string& dir, const HfShardPlan& plan, int rank, int world,
                             std::map<std::string, std::string> metadata)
    : dir_(dir), plan_(plan), rank_(rank), world_(world), meta_(std::move(metadata)) {}

HfShardWriter::~HfShardWriter() = default;  // an unfinished file's temporary is deleted

bool HfShardWriter::wanted(size_t i) const {
  return hf_file_rank(plan_.file_of[i], world_) == rank_;
}

void HfShardWriter::put(size_t i, const float* data) {
  SW_CHECK(wanted(i) && i >= next_, "HfShardWriter: tensors out of order");
  const int f = plan_.file_of[i];
  if (open_ != f) {
    if (w_) w_->finish();
    const size_t a = plan_.first[static_cast<size_t>(f)];
    const size_t b = static_cast<size_t>(f) + 1 < plan_.first.size()
                         ? plan_.first[static_cast<size_t>(f) + 1]
                         : plan_.tensors.size();
    SW_CHECK(i == a, "HfShardWriter: a file's first tensor was skipped");
    std::vector<StTensorDesc> descs(plan_.tensors.begin() + static_cast<std::ptrdiff_t>(a),
                                    plan_.tensors.begin() + static_cast<std::ptrdiff_t>(b));
    w_ = std::make_unique<SafeTensorsWriter>(dir_ + "/" + plan_.files[static_cast<size_t>(f)],
                                             std::move(descs), meta_);
    open_ = f;
  }
  w_->write_tensor(plan_.tensors[i].name, data);
  w_->start_writeback();
  bytes_ += static_cast<uint64_t>(numel(plan_.tensors[i].shape)) * 4;
  next_ = i + 1;
}

void HfShardWriter::finish() {
  if (w_) w_->finish();
  w_.reset();
  // Every file of this rank must have been opened and finished in turn.
  for (size_t f = 0; f < plan_.files.size(); ++f)
    if (hf_file_rank(static_cast<int>(f), world_) == rank_ && static_cast<int>(f) > open_)
      fail("export", dir_ + "/" + plan_.files[f] + ": not written (tensors missing)");
}

void write_hf_dir_extras(const std::string& dir, const ModelConfig& c, const HfShardPlan& plan,
                         const std::string& tokenizer) {
  ojson config = hf_config_json(c, dir + "/config.json");
  write_tokenizer(dir, tokenizer, c.seq_len, config);
  write_file_synced(dir + "/config.json", config.dump(2) + "\n");
  if (plan.files.size() > 1) {
    ojson map = ojson::object();
    for (size_t i = 0; i < plan.tensors.size(); ++i)
      map[plan.tensors[i].name] = plan.files[static_cast<size_t>(plan.file_of[i])];
    ojson index = {{"metadata", {{"total_size", plan.total_size}}}, {"weight_map", map}};
    write_file_synced(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
}

namespace {

// The last, collective step of an export over `g`: rank 0 writes config, index and tokenizer
// into `tmp` and renames it to `dir` (removing `tmp` if that fails); every rank then throws
// its own `err` if set, or says rank 0 failed.
void finish_hf_dir(Group& g, const std::string& tmp, const std::string& dir,
                   const ModelConfig& cfg, const HfShardPlan& plan, const std::string& tokenizer,
                   std::string& err) {
  if (g.rank() == 0) try {
      write_hf_dir_extras(tmp, cfg, plan, tokenizer);
      fsync_dir(tmp);
      replace_dir(tmp, dir, "export");
    } catch (const std::exception& e) {
      err = e.what();
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
  float ok = err.empty() ? 1.f : 0.f;
  g.broadcast(&ok, 1, 0);
  if (!err.empty()) throw Error(err);
  if (ok != 1.f) fail("export", dir + ": rank 0 could not finish the directory (see its error)");
}

// pwrite of all n bytes at `off`, or one line naming the file.
void pwrite_all(int fd, const void* data, size_t n, uint64_t off, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("export", path + ": write failed (" + std::strerror(errno) + ")");
    p += w, n -= static_cast<size_t>(w), off += static_cast<uint64_t>(w);
  }
}

// export_hf_dir of a model cut into pipeline stages (hf_export.h): collective over `world`.
void export_hf_dir_stages(const ShardedModel& model, const std::string& dir,
                          const HfExportOptions& o, HfExportStats* stats, Group& world) {
  Model& mdl = const_cast<ShardedModel&>(model).model();  // (read only)
  const ModelConfig& cfg = mdl.config;
  const StageView& sv = mdl.stage;
  const Group* tg = model.tensor_group();
  const bool writer = !tg || tg->rank() == 0;  // tensor rank 0 writes the logical tensors
  Group& g = model.group();
  const int D = g.size(), drank = g.rank(), R = world.rank();
  if (o.max_shard_bytes <= 0)
    fail("export", "checkpoint.export_shard_bytes must be positive (got " +
                       std::to_string(o.max_shard_bytes) + ")");
  // Every stage's tensors, described by its data and tensor rank 0: the whole model's plan,
  // the same on every rank (a unit two stages hold is described twice, alike).
  const bool describes = writer && drank == 0;
  ojson mine = ojson::array();
  if (describes)
    for (int u = 0; u < model.num_units(); ++u) {
      ojson specs = ojson::array();
      for (const ParamSpec& s : model.logical_specs(u))
        specs.push_back({hf_dir_tensor_name(cfg, hf_file_name(s)), hf_file_shape(s), s.hf_transpose});
      mine.push_back({{"unit", sv.global_unit[static_cast<size_t>(u)]}, {"specs", std::move(specs)}});
    }
  std::vector<ojson> units(static_cast<size_t>(sv.global_units));
  for (const std::string& text : all_gather_strings(world, describes ? mine.dump() : std::string())) {
    if (text.empty()) continue;
    for (const ojson& e : ojson::parse(text)) units.at(e["unit"].get<size_t>()) = e["specs"];
  }
  std::vector<StTensorDesc> descs;
  std::vector<bool> transpose;
  std::vector<size_t> unit_first;  // per global unit, its first tensor in the plan
  std::set<std::string> seen;
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].is_null())
      fail("export", dir + ": no pipeline stage describes unit " + std::to_string(u));
    unit_first.push_back(descs.size());
    for (const ojson& t : units[u]) {
      std::string n = t[0].get<std::string>();
      if (!seen.insert(n).second)
        fail("export", dir + ": two parameters export to the same name '" + n + "'");
      descs.push_back({std::move(n), StDType::F32, t[1].get<Shape>()});
      transpose.push_back(t[2].get<bool>());
    }
  }
  const HfShardPlan plan = plan_hf_shards(std::move(descs), o.max_shard_bytes);
  const std::map<std::string, std::string> meta = hf_export_metadata(cfg);
  const std::string tmp = dir + ".tmp";
  // The plan's tensors this rank writes, in for_each_param's order (-1: not this rank's).
  std::vector<int64_t> mine_idx;
  std::vector<bool> writes(plan.tensors.size(), false);
  for (int u = 0; u < model.num_units(); ++u) {
    bool lower = true;  // this stage writes the unit (the lower of two stages holding it)
    for (size_t i = 0; i < sv.shared.size(); ++i)
      if (sv.shared[i] == u && sv.shared_peer[i] < sv.rank) lower = false;
    const size_t first = unit_first[static_cast<size_t>(sv.global_unit[static_cast<size_t>(u)])];
    const size_t n = model.logical_specs(u).size();
    for (size_t j = 0; j < n; ++j) {
      const size_t i = first + j;
      const bool w = writer && lower && hf_file_rank(plan.file_of[i], D) == drank;
      mine_idx.push_back(w ? static_cast<int64_t>(i) : -1);
      if (w) writes[i] = true;
    }
  }
  // Each file's header and offsets (every rank computes them: no communication).
  std::vector<uint64_t> offset(plan.tensors.size()), file_bytes(plan.files.size());
  std::vector<std::string> header(plan.files.size());
  for (size_t f = 0; f < plan.files.size(); ++f) {
    const size_t a = plan.first[f], b = f + 1 < plan.first.size() ? plan.first[f + 1] : plan.tensors.size();
    std::vector<StTensorDesc> fd(plan.tensors.begin() + static_cast<std::ptrdiff_t>(a),
                                 plan.tensors.begin() + static_cast<std::ptrdiff_t>(b));
    std::vector<uint64_t> ends;
    header[f] = safetensors_header(tmp + "/" + plan.files[f], fd, meta, &ends);
    for (size_t i = a; i < b; ++i) offset[i] = header[f].size() + (i == a ? 0 : ends[i - a - 1]);
    file_bytes[f] = header[f].size() + (ends.empty() ? 0 : ends.back());
  }
  // Errors are kept, not thrown, until every rank has been through the collectives.
  std::string err;
  auto agree = [&](const std::string& what) {  // collective: throws on every rank if any failed
    if (!any_rank(world, !err.empty())) return;
    if (R == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    world.barrier();
    if (!err.empty()) throw Error(err);
    fail("export", dir + ": another rank " + what + " (see its error)");
  };
  if (R == 0) try {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      fs::create_directories(tmp, ec);
      if (ec) fail("export", tmp + ": cannot create (" + ec.message() + ")");
    } catch (const std::exception& e) {
      err = e.what();
    }
  agree("could not create " + tmp);
  // The writer of a file's first tensor creates it at its full size, with its header.
  for (size_t f = 0; f < plan.files.size() && err.empty(); ++f) {
    if (!writes[plan.first[f]]) continue;
    const std::string path = tmp + "/" + plan.files[f];
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      err = "export: " + path + ": cannot create (" + std::strerror(errno) + ")";
      break;
    }
    if (::ftruncate(fd, static_cast<off_t>(file_bytes[f])) != 0)
      err = "export: " + path + ": cannot size it (" + std::strerror(errno) + ")";
    try {
      if (err.empty()) pwrite_all(fd, header[f].data(), header[f].size(), 0, path);
    } catch (const std::exception& e) {
      err = e.what();
    }
    ::close(fd);
  }
  agree("could not create its weights files");
  // Every stage streams its parameters; each rank writes its tensors in place.
  int open_f = -1, fd = -1;
  std::set<int> touched;
  uint64_t bytes = 0;
  size_t k = 0;
  std::vector<float> t;
  auto close_file = [&] {
    if (fd < 0) return;
    const std::string path = tmp + "/" + plan.files[static_cast<size_t>(open_f)];
    if (::fsync(fd) != 0 && err.empty())
      err = "export: " + path + ": fsync failed (" + std::strerror(errno) + ")";
    ::close(fd);
    fd = -1;
  };
  model.for_each_param([&](const ParamSpec& s, const float* data) {
    const int64_t i = k < mine_idx.size() ? mine_idx[k] : -1;
    ++k;
    if (i < 0 || !err.empty()) return;
    try {
      const int f = plan.file_of[static_cast<size_t>(i)];
      const std::string path = tmp + "/" + plan.files[static_cast<size_t>(f)];
      if (f != open_f) {
        close_file();
        fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd < 0) fail("export", path + ": cannot open (" + std::strerror(errno) + ")");
        open_f = f;
        touched.insert(f);
      }
      if (transpose[static_cast<size_t>(i)]) {
        t.resize(static_cast<size_t>(numel(s.shape)));
        transpose_f32(t.data(), data, s.shape[0], s.shape[1]);
        data = t.data();
      }
      const size_t n = static_cast<size_t>(numel(plan.tensors[static_cast<size_t>(i)].shape)) * 4;
      pwrite_all(fd, data, n, offset[static_cast<size_t>(i)], path);
      bytes += n;
      writes[static_cast<size_t>(i)] = false;  // done
    } catch (const std::exception& e) {
      err = e.what();
    }
  });
  close_file();
  std::vector<float>().swap(t);
  if (err.empty())
    for (size_t i = 0; i < writes.size(); ++i)
      if (writes[i]) {
        err = "export: " + tmp + "/" + plan.files[static_cast<size_t>(plan.file_of[i])] +
              ": tensor '" + plan.tensors[i].name + "' not written (the stage did not hand it out)";
        break;
      }
  if (stats) {
    stats->bytes = bytes;
    stats->files = static_cast<int>(touched.size());
  }
  agree("could not write its weights");
  // World rank 0: config, index, tokenizer; then DIR.tmp becomes DIR.
  finish_hf_dir(world, tmp, dir, cfg, plan, o.tokenizer, err);
}

}  // namespace

void export_hf_dir(const ShardedModel& model, const std::string& dir, const HfExportOptions& o,
                   HfExportStats* stats, Group* world) {
  if (const_cast<ShardedModel&>(model).model().stage.split()) {
    if (!world)
      fail("export", dir + ": a pipeline stage's export is collective over every rank of the "
                           "mesh; pass the world group");
    export_hf_dir_stages(model, dir, o, stats, *world);
    return;
  }
  // Tensor parallelism: the ranks of tensor rank 0 (one per data-parallel slot, the data group
  // of that tensor rank) write the logical tensors; the others lend their parts to
  // for_each_param's gathers over the tensor group.
  if (const Group* tg = model.tensor_group(); tg && tg->rank() != 0) {
    model.for_each_param([](const ParamSpec&, const float*) {});
    return;
  }
  Group& g = model.group();
  const int W = g.size(), R = g.rank();
  // ShardedModel::model() has no const overload; reading the config modifies nothing.
  const ModelConfig& cfg = const_cast<ShardedModel&>(model).model().config;
  if (o.max_shard_bytes <= 0)
    fail("export", "checkpoint.export_shard_bytes must be positive (got " +
                       std::to_string(o.max_shard_bytes) + ")");
  // The plan, from the layouts every rank has (no communication): for_each_param's order.
  std::vector<StTensorDesc> descs;
  std::vector<bool> transpose;
  std::set<std::string> seen;
  for (int u = 0; u < model.num_units(); ++u)
    for (const ParamSpec& s : model.logical_specs(u)) {
      std::string n = hf_dir_tensor_name(cfg, hf_file_name(s));
      if (!seen.insert(n).second)
        fail("export", dir + ": two parameters export to the same name '" + n + "'");
      descs.push_back({std::move(n), StDType::F32, hf_file_shape(s)});
      transpose.push_back(s.hf_transpose);
    }
  const HfShardPlan plan = plan_hf_shards(std::move(descs), o.max_shard_bytes);
  const std::string tmp = dir + ".tmp";

  // Rank 0 makes the temporary directory; every rank then writes its files into it. Errors
  // are kept, not thrown, until every rank has been through the collective gathers.
  std::string err;
  if (R == 0) try {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      fs::create_directories(tmp, ec);
      if (ec) fail("export", tmp + ": cannot create (" + ec.message() + ")");
    } catch (const std::exception& e) {
      err = e.what();
    }
  if (any_rank(g, !err.empty())) {
    if (!err.empty()) throw Error(err);
    fail("export", dir + ": rank 0 could not create " + tmp + " (see its error)");
  }
  HfShardWriter w(tmp, plan, R, W, hf_export_metadata(cfg));
  size_t i = 0;
  std::vector<float> t;
  model.for_each_param([&](const ParamSpec& s, const float* data) {
    const size_t k = i++;
    if (!err.empty() || !w.wanted(k)) return;
    try {
      if (transpose[k]) {
        t.resize(static_cast<size_t>(numel(s.shape)));
        transpose_f32(t.data(), data, s.shape[0], s.shape[1]);
        data = t.data();
      }
      w.put(k, data);
    } catch (const std::exception& e) {
      err = e.what();
    }
  });
  std::vector<float>().swap(t);
  if (stats) {
    stats->bytes = w.bytes_written();
    stats->files = 0;
    for (size_t f = 0; f < plan.files.size(); ++f)
      stats->files += hf_file_rank(static_cast<int>(f), W) == R;
  }
  if (err.empty()) try {
      w.finish();
    } catch (const std::exception& e) {
      err = e.what();
    }
  if (any_rank(g, !err.empty())) {
    if (R == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    g.barrier();
    if (!err.empty()) throw Error(err);
    fail("export", dir + ": another rank could not write its weights files (see its error)");
  }
  // Rank 0: config, index, tokenizer; then DIR.tmp becomes DIR.
  finish_hf_dir(g, tmp, dir, cfg, plan, o.tokenizer, err);
}

}  // namespace sw
