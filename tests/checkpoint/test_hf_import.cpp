// Hugging Face model directories in (checkpoint/hf_import.h), against transformers itself:
// tests/checkpoint/hf_models.py builds small models with random weights (GPT-2 tied; Llama with
// GQA and llama3 RoPE scaling, untied and tied in bf16; Qwen2 with q/k/v biases; Mistral saved
// sharded with an index, in fp16), saves them with save_pretrained and writes transformers' fp32
// logits at every position of fixed ids and a greedy continuation (generate, do_sample=False).
// Each is imported through the C++ API (read_hf_config, build_model, import_safetensors on the
// directory): logits within 1e-4 relative of the largest, the continuation exactly. Then bad
// inputs: one line naming the file and the key; and checkpoint.init_from naming a directory in
// a run's config (the model block from config.json, the run's keys overriding).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/export.h"
#include "checkpoint/hf_import.h"
#include "core/error.h"
#include "engine/config.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"
#include "st_test_util.h"

using namespace sw;

namespace {

struct Ref {
  int B = 0, T = 0, V = 0;
  std::vector<int32_t> ids;
  std::vector<float> logits;  // (B, T, V)
  std::vector<int32_t> greedy;
};

Ref read_ref(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  Ref r;
  std::string tag;
  f >> tag >> r.B >> r.T;
  REQUIRE(tag == "ids");
  r.ids.resize(size_t(r.B * r.T));
  for (auto& x : r.ids) f >> x;
  int b, t;
  f >> tag >> b >> t >> r.V;
  REQUIRE(tag == "logits");
  r.logits.resize(size_t(r.B * r.T * r.V));
  for (auto& x : r.logits) f >> x;
  int n = 0;
  f >> tag >> n;
  REQUIRE(tag == "greedy");
  r.greedy.resize(size_t(n));
  for (auto& x : r.greedy) f >> x;
  REQUIRE(f.good());
  return r;
}

// The models and references, made once per test process.
const std::string& reference_dir() {
  static sttest::TempDir dir("hf_import");
  static bool made = false;
  if (!made) {
    const std::string cmd = std::string(SW_REF_PYTHON) + " " + SW_SOURCE_DIR +
                            "/tests/checkpoint/hf_models.py " + dir.path.string();
    INFO(cmd);
    REQUIRE(std::system(cmd.c_str()) == 0);  // the reference venv (scripts/setup.sh)
    made = true;
  }
  static const std::string p = dir.path.string();
  return p;
}

// Logits of the last position of rows (B, t) of `ids` (B, T).
std::vector<float> logits_at(ShardedModel& sm, const std::vector<int32_t>& ids, int B, int T,
                             int t, int V) {
  std::vector<int32_t> tok(size_t(B * t));
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < t; ++i) tok[size_t(b * t + i)] = ids[size_t(b * T + i)];
  Batch bt;
  bt.B = B, bt.T = t, bt.tokens = tok.data();
  std::vector<float> out(size_t(B * V));
  sm.logits_last(bt, out.data());
  return out;
}

void check_model(const std::string& name) {
  const std::string root = reference_dir();
  const std::string dir = root + "/" + name;
  const Ref ref = read_ref(root + "/" + name + ".ref");
  const HfConfig hc = read_hf_config(dir);
  Model m = build_model(hc.model);
  REQUIRE(m.config.vocab_size == ref.V);
  ShardedModel sm(m, ops_for(Device::cpu()), 99);  // other random weights until imported
  import_safetensors(sm, dir);

  double max_rel = 0;
  for (int t = 1; t <= ref.T; ++t) {
    const std::vector<float> got = logits_at(sm, ref.ids, ref.B, ref.T, t, ref.V);
    for (int b = 0; b < ref.B; ++b) {
      const float* want = ref.logits.data() + size_t((b * ref.T + t - 1) * ref.V);
      float scale = 0;
      for (int v = 0; v < ref.V; ++v) scale = std::max(scale, std::fabs(want[v]));
      for (int v = 0; v < ref.V; ++v)
        max_rel =
            std::max(max_rel, double(std::fabs(got[size_t(b * ref.V + v)] - want[v])) / scale);
    }
  }
  std::printf("hf_import %s: max |logit - transformers| / max |logit| = %.3g\n", name.c_str(),
              max_rel);
  CHECK(max_rel < 1e-4);

  // Greedy continuation of the first row.
  std::vector<int32_t> seq(ref.ids.begin(), ref.ids.begin() + ref.T);
  for (size_t k = 0; k < ref.greedy.size(); ++k) {
    const int t = int(seq.size());
    const std::vector<float> l = logits_at(sm, seq, 1, t, t, ref.V);
    seq.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
  }
  const std::vector<int32_t> ours(seq.begin() + ref.T, seq.end());
  CHECK(ours == ref.greedy);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("hf import: transformers' GPT-2 (tied, transformer. names)", "[checkpoint][reference]") {
  check_model("gpt2");
}

TEST_CASE("hf import: Llama with GQA and llama3 RoPE scaling, untied", "[checkpoint][reference]") {
  check_model("llama3_untied");
}

TEST_CASE("hf import: Llama tied (Llama 3.2 style), saved in bf16", "[checkpoint][reference]") {
  check_model("llama3_tied_bf16");
}

TEST_CASE("hf import: Qwen2 (q/k/v biases)", "[checkpoint][reference]") { check_model("qwen2"); }

TEST_CASE("hf import: Mistral sharded with an index, in fp16", "[checkpoint][reference]") {
  REQUIRE(std::filesystem::exists(reference_dir() +
                                  "/mistral_sharded/model.safetensors.index.json"));
  check_model("mistral_sharded");
}

TEST_CASE("hf import: bad inputs are one line naming the file and key", "[checkpoint][reference]") {
  const std::string root = reference_dir();
  sttest::TempDir tmp("hf_import_bad");
  auto copy_dir = [&](const std::string& from, const std::string& to) {
    std::filesystem::copy(root + "/" + from, tmp.file(to),
                          std::filesystem::copy_options::recursive);
    return tmp.file(to);
  };
  auto edit_config = [&](const std::string& dir, const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j;
    std::ifstream(dir + "/config.json") >> j;
    f(j);
    std::ofstream(dir + "/config.json") << j.dump(2);
  };
  auto one_line = [](const std::string& m) { return m.find('\n') == std::string::npos; };

  const std::string arch = copy_dir("llama3_untied", "arch");
  edit_config(arch, [](nlohmann::json& j) { j["architectures"] = {"FalconForCausalLM"}; });
  std::string m = error_of([&] { read_hf_config(arch); });
  CHECK_THAT(m, Catch::StartsWith("import: " + arch + "/config.json: architectures: ") &&
                    Catch::Contains("'FalconForCausalLM' is not supported"));
  CHECK(one_line(m));

  const std::string miss = copy_dir("qwen2", "missing");
  edit_config(miss, [](nlohmann::json& j) { j.erase("hidden_size"); });
  m = error_of([&] { read_hf_config(miss); });
  CHECK_THAT(m, Catch::StartsWith("import: " + miss + "/config.json: hidden_size: missing"));
  CHECK(one_line(m));

  const std::string yarn = copy_dir("llama3_untied", "yarn");
  edit_config(yarn, [](nlohmann::json& j) { j["rope_scaling"]["rope_type"] = "yarn"; });
  m = error_of([&] { read_hf_config(yarn); });
  CHECK_THAT(m, Catch::StartsWith("import: " + yarn + "/config.json: rope_scaling.rope_type: "));

  const std::string mlp = copy_dir("llama3_untied", "mlp_bias");
  edit_config(mlp, [](nlohmann::json& j) { j["mlp_bias"] = true; });
  CHECK_THAT(error_of([&] { read_hf_config(mlp); }),
             Catch::StartsWith("import: " + mlp + "/config.json: mlp_bias: true is not supported"));

  // A sliding window shorter than the run's context.
  const std::string win = copy_dir("mistral_sharded", "window");
  edit_config(win, [](nlohmann::json& j) { j["sliding_window"] = 16; });
  const HfConfig wc = read_hf_config(win);
  check_hf_window(wc, 16);  // as long as the run: the same math
  CHECK_THAT(error_of([&] { check_hf_window(wc, 32); }),
             Catch::StartsWith("import: " + win + "/config.json: sliding_window: 16 is shorter"));

  // An index naming a file that is not there: the index and the file, before any read.
  const std::string idx = copy_dir("mistral_sharded", "index");
  std::filesystem::remove(idx + "/model-00003-of-00012.safetensors");
  Model mm = build_model(read_hf_config(idx).model);
  ShardedModel sm(mm, ops_for(Device::cpu()), 1);
  m = error_of([&] { import_safetensors(sm, idx); });
  CHECK_THAT(m, Catch::StartsWith("import: " + idx +
                                  "/model.safetensors.index.json: weight_map.") &&
                    Catch::Contains("file 'model-00003-of-00012.safetensors' does not exist"));
  CHECK(one_line(m));
}

TEST_CASE("hf import: checkpoint.init_from DIR is the model block, the run keys override it",
          "[checkpoint][reference]") {
  const std::string dir = reference_dir() + "/llama3_untied";
  const std::string from = R"("checkpoint": {"init_from": ")" + dir + R"("})";
  // No model block: config.json's, whole.
  TrainConfig c = parse_config("{" + from + "}", "run.json", {}, 1);
  const ModelConfig want = read_hf_config(dir).model;
  CHECK(c.model.type == "llama");
  CHECK(c.model.d_model == want.d_model);
  CHECK(c.model.n_kv_head == 2);
  CHECK(c.model.d_ff == 96);
  CHECK(c.model.seq_len == 64);
  CHECK(c.model.rope_theta == 500000.f);
  CHECK(c.model.rope_scaling == "llama3");
  CHECK(c.model.rope_original_max_pos == 16);
  CHECK(!c.model.tied());
  CHECK(c.model.hf_architecture == "LlamaForCausalLM");
  CHECK(c.notes.empty());
  // The resolved config reads back to the same model.
  const TrainConfig again = parse_config(c.resolved_json, "resolved", {}, 1);
  CHECK(again.model.rope_factor == c.model.rope_factor);
  CHECK(again.model.n_layer == c.model.n_layer);

  // Keys given override it, one note each (the same value: no note).
  c = parse_config(R"({"model": {"seq_len": 32, "rope_theta": 10000, "n_layer": 2}, )" + from +
                       "}",
                   "run.json", {}, 1);
  CHECK(c.model.seq_len == 32);
  CHECK(c.model.rope_theta == 10000.f);
  REQUIRE(c.notes.size() == 2);
  CHECK_THAT(c.notes[0], Catch::Contains("model.rope_theta: " + dir + "/config.json has 500000"));
  CHECK_THAT(c.notes[0], Catch::Contains("the run's 10000 is used"));
  CHECK_THAT(c.notes[1], Catch::Contains("model.seq_len"));

  // 0, the default of n_kv_head and d_ff, stands for what it resolves to: GPT-2's 4 d_model
  // agrees with config.json; for this GQA Llama, n_kv_head 0 (= n_head) does not.
  const std::string from_gpt2 =
      R"("checkpoint": {"init_from": ")" + reference_dir() + R"(/gpt2"})";
  c = parse_config(R"({"model": {"n_kv_head": 0, "d_ff": 0}, )" + from_gpt2 + "}", "run.json",
                   {}, 1);
  CHECK(c.model.d_ff == 256);
  CHECK(c.notes.empty());
  CHECK_THAT(error_of([&] {
               parse_config(R"({"model": {"n_kv_head": 0}, )" + from + "}", "run.json", {}, 1);
             }),
             Catch::Contains("model.n_kv_head") && Catch::Contains("does not fit the weights"));

  // Shapes that would not fit the weights are errors.
  std::string m = error_of([&] {
    parse_config(R"({"model": {"d_model": 128}, )" + from + "}", "run.json", {}, 1);
  });
  CHECK_THAT(m, Catch::Contains("model.d_model") && Catch::Contains("does not fit the weights"));
  m = error_of([&] {
    parse_config(R"({"model": {"tie_embeddings": true}, )" + from + "}", "run.json", {}, 1);
  });
  CHECK_THAT(m, Catch::Contains("model.tie_embeddings"));
}
