// Hugging Face directory export (checkpoint/hf_export.h). Unit: how tensors are cut into files,
// config.json per architecture and its refusals, `ckpt export --out DIR` against the single
// file and against the live model's export. Reference: transformers' AutoModelForCausalLM and
// AutoTokenizer load what a short training run exports (GPT-2 tied and untied, Llama with GQA,
// a tied Llama 3 with llama3 RoPE scaling, Qwen2 with q/k/v biases) and give Shardwise's logits
// within 1e-4 (tests/checkpoint/hf_export_check.py); a sharded export loads the same; the
// exported tokenizer.json / tokenizer.model encode as `tokenizers` / `sentencepiece`.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/hf_export.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"
#include "st_test_util.h"
#include "tests/common/sim_device.h"

using namespace sw;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

ModelConfig gpt2(bool tie) {
  ModelConfig c;
  c.type = "gpt2";
  c.vocab_size = 96;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  c.seq_len = 16;
  c.tie_embeddings = tie;
  return c;
}

ModelConfig llama() {
  ModelConfig c;
  c.type = "llama";
  c.vocab_size = 96;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 64;
  c.seq_len = 16;
  c.rope_theta = 500000.f;
  c.norm_eps = 1e-6f;
  c.tie_embeddings = false;
  return c;
}

// A few AdamW steps on fixed batches, so the weights are no longer the init's.
void train(ShardedModel& sm, int V, int steps) {
  const int B = 2, T = 16;
  std::vector<int32_t> in(B * T), tg(B * T);
  Batch b;
  b.B = B, b.T = T, b.tokens = in.data(), b.targets = tg.data();
  for (int s = 1; s <= steps; ++s) {
    for (int i = 0; i < B * T; ++i) {
      in[size_t(i)] = (i * 37 + s * 11) % V;
      tg[size_t(i)] = (i * 23 + s * 3) % V;
    }
    sm.zero_grads();
    sm.forward_backward(b);
    sm.optimizer_step(AdamWParams{}, 1e-2f, 1.f, s);
  }
}

// ids (B, T) and Shardwise's logits of each row's last position, as hf_export_check.py reads.
[[maybe_unused]] void write_logits(ShardedModel& sm, int V, const std::string& path) {
  const int B = 3, T = 11;
  std::vector<int32_t> ids(B * T);
  for (int i = 0; i < B * T; ++i) ids[size_t(i)] = (i * 29 + 7) % V;
  Batch b;
  b.B = B, b.T = T, b.tokens = ids.data();
  std::vector<float> lg(size_t(B * V));
  sm.logits_last(b, lg.data());
  std::ofstream f(path, std::ios::binary);
  const int32_t h[3] = {B, T, V};
  f.write(reinterpret_cast<const char*>(h), sizeof h);
  f.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 4));
  f.write(reinterpret_cast<const char*>(lg.data()), std::streamsize(lg.size() * 4));
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Every tensor of a directory (its single file, or its index's files) as raw bytes.
[[maybe_unused]] std::map<std::string, std::string> dir_tensors(const std::string& dir) {
  std::vector<std::string> files;
  if (fs::exists(dir + "/model.safetensors")) {
    files.push_back(dir + "/model.safetensors");
  } else {
    const auto idx = nlohmann::json::parse(slurp(dir + "/model.safetensors.index.json"));
    std::set<std::string> fs_;
    for (auto& [k, v] : idx["weight_map"].items()) fs_.insert(v.get<std::string>());
    for (const auto& f : fs_) files.push_back(dir + "/" + f);
  }
  std::map<std::string, std::string> out;
  for (const auto& f : files) {
    SafeTensorsReader r(f);
    for (const StTensorInfo& t : r.tensors()) {
      std::string b(t.bytes(), '\0');
      r.read_bytes(t.name, b.data());
      out[t.name] = std::move(b);
    }
  }
  return out;
}

}  // namespace

// Built twice (tests/checkpoint/CMakeLists.txt): the unit cases, and with
// SW_HF_EXPORT_REFERENCE the case that runs transformers (label reference).
#ifndef SW_HF_EXPORT_REFERENCE
TEST_CASE("hf export: tensors are cut into files by size as transformers does", "[hf_export]") {
  auto t = [](const char* n, int64_t floats) { return StTensorDesc{n, StDType::F32, {floats}}; };
  // 100-byte files: 40+40 | 40+40 (the next would make 120) | 200 alone | 8
  HfShardPlan p = plan_hf_shards({t("a", 10), t("b", 10), t("c", 10), t("d", 10), t("e", 50),
                                  t("f", 2)},
                                 100);
  CHECK(p.file_of == std::vector<int>{0, 0, 1, 1, 2, 3});
  CHECK(p.first == std::vector<size_t>{0, 2, 4, 5});
  CHECK(p.total_size == 368);
  REQUIRE(p.files.size() == 4);
  CHECK(p.files[0] == "model-00001-of-00004.safetensors");
  CHECK(p.files[3] == "model-00004-of-00004.safetensors");
  // A large tensor first gets a file of its own too; everything in one file: model.safetensors.
  p = plan_hf_shards({t("big", 50), t("x", 1)}, 100);
  CHECK(p.file_of == std::vector<int>{0, 1});
  p = plan_hf_shards({t("a", 10), t("b", 15)}, kHfDefaultShardBytes);
  CHECK(p.files == std::vector<std::string>{"model.safetensors"});
  CHECK(hf_file_rank(0, 2) == 0);
  CHECK(hf_file_rank(3, 2) == 1);
}

TEST_CASE("hf export: config.json per architecture and what it refuses", "[hf_export]") {
  auto j = hf_config_json(gpt2(true), "x");
  CHECK(j["architectures"][0] == "GPT2LMHeadModel");
  CHECK(j["n_positions"] == 16);
  CHECK(j["n_inner"] == 128);
  CHECK(j["activation_function"] == "gelu_new");
  CHECK(j["tie_word_embeddings"] == true);
  CHECK(j["torch_dtype"] == "float32");
  ModelConfig l = build_model(llama()).config;
  j = hf_config_json(l, "x");
  CHECK(j["architectures"][0] == "LlamaForCausalLM");
  CHECK(j["num_key_value_heads"] == 2);
  CHECK(j["intermediate_size"] == l.d_ff);
  CHECK(j["rms_norm_eps"].get<double>() == 1e-6);  // the float's shortest decimal
  CHECK(j["rope_scaling"].is_null());
  l.rope_scaling = "llama3";
  l.rope_factor = 32.f;
  l.rope_original_max_pos = 8;
  j = hf_config_json(l, "x");
  CHECK(j["rope_scaling"]["rope_type"] == "llama3");
  CHECK(j["rope_scaling"]["factor"].get<double>() == 32.0);
  CHECK(j["rope_scaling"]["original_max_position_embeddings"] == 8);
  l.hf_architecture = "MistralForCausalLM";
  CHECK_THROWS_WITH(hf_config_json(l, "d/config.json"),
                    Contains("d/config.json: model.rope_scaling") && Contains("Mistral"));
  l.rope_scaling = "none";
  CHECK(hf_config_json(l, "x")["model_type"] == "mistral");
  l.qkv_bias = true;
  CHECK_THROWS_WITH(hf_config_json(l, "x"), Contains("model.qkv_bias"));
  l.hf_architecture = "";
  j = hf_config_json(l, "x");
  CHECK(j["architectures"][0] == "Qwen2ForCausalLM");
  CHECK(j["model_type"] == "qwen2");
  l.hf_architecture = "FalconForCausalLM";
  CHECK_THROWS_WITH(hf_config_json(l, "x"), Contains("model.hf_architecture: 'FalconForCausalLM'"));
  // Untied GPT-2: transformers' base-model prefix beside lm_head (it refuses the file without).
  CHECK(hf_dir_tensor_name(gpt2(false), "wte.weight") == "transformer.wte.weight");
  CHECK(hf_dir_tensor_name(gpt2(false), "lm_head.weight") == "lm_head.weight");
  CHECK(hf_dir_tensor_name(gpt2(true), "wte.weight") == "wte.weight");
}

TEST_CASE("hf export: ckpt export --out DIR, sharded or not, holds the single file's tensors and "
          "the live model's bytes",
          "[hf_export]") {
  sttest::TempDir dir("hf_export_ckpt");
  Model m = build_model(llama());
  ShardedModel sm(m, ops_for(Device::cpu()), 5);
  train(sm, 96, 2);
  TrainState st;
  st.step = 2;
  save_checkpoint(sm, st, dir.file("step_2"));
  export_checkpoint(dir.file("step_2"), dir.file("one.safetensors"));
  export_checkpoint(dir.file("step_2"), dir.file("whole"));
  HfExportOptions o;
  o.max_shard_bytes = 40000;
  o.tokenizer = "bytes";
  export_checkpoint(dir.file("step_2"), dir.file("sharded"), o);
  export_hf_dir(sm, dir.file("live"), o);

  CHECK(fs::exists(dir.file("whole/model.safetensors")));
  CHECK(!fs::exists(dir.file("whole/model.safetensors.index.json")));
  CHECK(!fs::exists(dir.file("whole.tmp")));
  CHECK(!fs::exists(dir.file("sharded/model.safetensors")));
  const auto idx = nlohmann::json::parse(slurp(dir.file("sharded/model.safetensors.index.json")));
  std::set<std::string> files;
  for (auto& [k, v] : idx["weight_map"].items()) files.insert(v.get<std::string>());
  CHECK(files.size() >= 3);
  const auto one = dir_tensors(dir.file("whole")), many = dir_tensors(dir.file("sharded"));
  uint64_t total = 0;
  for (const auto& [k, v] : one) total += v.size();
  CHECK(idx["metadata"]["total_size"].get<uint64_t>() == total);
  CHECK(many == one);
  {
    SafeTensorsReader r(dir.file("one.safetensors"));
    for (const auto& [k, v] : one) {
      std::string b(r.at(k).bytes(), '\0');
      r.read_bytes(k, b.data());
      CHECK(b == v);
    }
    CHECK(r.tensors().size() == one.size());
  }
  // The live model's export writes the same files, byte for byte.
  for (const std::string& f : files)
    CHECK(slurp(dir.file("live/" + f)) == slurp(dir.file("sharded/" + f)));
  CHECK(slurp(dir.file("live/config.json")) == slurp(dir.file("sharded/config.json")));
  CHECK(!fs::exists(dir.file("live/tokenizer_config.json")));  // bytes: no tokenizer files
  // A bad shard size and an unexportable model are one line each; nothing is left behind.
  o.max_shard_bytes = 0;
  CHECK_THROWS_WITH(export_checkpoint(dir.file("step_2"), dir.file("bad"), o),
                    Contains("--max-shard-bytes"));
  o.max_shard_bytes = 1000;
  o.tokenizer = dir.file("nope.json");
  CHECK_THROWS_WITH(export_hf_dir(sm, dir.file("bad"), o), Contains("data.tokenizer") &&
                                                               Contains("nope.json"));
  CHECK(!fs::exists(dir.file("bad")));
  CHECK(!fs::exists(dir.file("bad.tmp")));
}

TEST_CASE("hf export: a model on a device (the simulated accelerator) exports the CPU's bytes",
          "[hf_export]") {
  // The sim's memory faults when host code touches it: the export must copy each unit out.
  sttest::TempDir dir("hf_export_sim");
  Model mc = build_model(llama()), ms = build_model(llama());
  ShardedModel cpu(mc, ops_for(Device::cpu()), 9), sim(ms, ops_for(Device::sim(0)), 9);
  train(cpu, 96, 2);
  train(sim, 96, 2);
  HfExportOptions o;
  o.max_shard_bytes = 50000;
  export_hf_dir(cpu, dir.file("cpu"), o);
  export_hf_dir(sim, dir.file("sim"), o);
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir.file("cpu"))) {
    CHECK(slurp(e.path().string()) == slurp(dir.file("sim/" + e.path().filename().string())));
    ++n;
  }
  CHECK(n >= 4);
}

#else
TEST_CASE("hf export: transformers loads the exported directories and gives Shardwise's logits",
          "[hf_export][reference]") {
  sttest::TempDir dir("hf_export_ref");
  {
    std::ofstream f(dir.file("corpus.txt"));
    for (int i = 0; i < 60; ++i)
      f << "the quick brown fox " << i % 7 << " jumps over   the lazy dog<|endoftext|>\n"
        << "pack my box with five dozen liquor jugs, said " << (i * 13) % 11 << "\n";
  }
  const std::string py = std::string(SW_REF_PYTHON) + " " + SW_SOURCE_DIR +
                         "/tests/checkpoint/hf_export_check.py ";
  const std::string mk =
      py + "tokenizer " + dir.file("tokenizer.json") + " " + dir.file("corpus.txt");
  INFO(mk);
  REQUIRE(std::system(mk.c_str()) == 0);  // the reference venv (scripts/setup.sh)
  const std::string mks = py + "spm " + dir.file("sp.model") + " " + dir.file("corpus.txt");
  INFO(mks);
  REQUIRE(std::system(mks.c_str()) == 0);

  struct Case {
    std::string name;
    ModelConfig c;
  };
  ModelConfig tied3 = llama();
  tied3.tie_embeddings = true;
  tied3.rope_scaling = "llama3";
  tied3.rope_factor = 8.f;
  tied3.rope_original_max_pos = 8;  // every region of the scaling at head_dim 16
  ModelConfig qwen = llama();
  qwen.qkv_bias = true;
  const std::vector<Case> cases = {
      {"gpt2_tied", gpt2(true)}, {"gpt2_untied", gpt2(false)}, {"llama_gqa", llama()},
      {"llama3_tied", tied3},    {"qwen2", qwen}};
  std::string names;
  for (const Case& k : cases) {
    Model m = build_model(k.c);
    ShardedModel sm(m, ops_for(Device::cpu()), 17);
    train(sm, k.c.vocab_size, 3);
    HfExportOptions o;
    // Llama 2 style: the SentencePiece model; the others: the BPE tokenizer.json.
    o.tokenizer = dir.file(k.name == "llama_gqa" ? "sp.model" : "tokenizer.json");
    export_hf_dir(sm, dir.file(k.name), o);
    if (k.name == "llama_gqa") {
      o.max_shard_bytes = 60000;
      export_hf_dir(sm, dir.file(k.name + ".sharded"), o);
    }
    write_logits(sm, k.c.vocab_size, dir.file(k.name + ".logits"));
    names += " " + k.name;
  }
  const std::string cmd = py + "check " + dir.path.string() + names;
  INFO(cmd);
  CHECK(std::system(cmd.c_str()) == 0);
}
#endif
