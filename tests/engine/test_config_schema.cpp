// The config keys' one declaration (engine/config_schema.cpp): README.md's key table is generated
// from it, a default-constructed TrainConfig agrees with its defaults, the reader enforces its
// ranges, and the resolved config lists every declared key.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/config.h"
#include "engine_test_util.h"
#include "offload/aio.h"

using namespace sw;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {
using enginetest::error_of;
using enginetest::parse;

const json& declaration() {
  static const json d = json::parse(config_declaration_json());
  return d;
}

// The value at a dotted key path, or nullptr when a component is missing.
const json* at(const json& root, const std::string& path) {
  const json* cur = &root;
  std::stringstream ss(path);
  std::string k;
  while (std::getline(ss, k, '.')) {
    if (!cur->is_object() || !cur->contains(k)) return nullptr;
    cur = &(*cur)[k];
  }
  return cur;
}

// Keys that take effect (written in the resolved config): neither compatibility-only nor an
// alias of another key.
std::vector<json> effective_keys() {
  std::vector<json> out;
  for (const json& k : declaration())
    if (!k["compat"].get<bool>() && !k["alias"].get<bool>()) out.push_back(k);
  return out;
}

std::string readme_table() {
  std::ifstream f(SW_SOURCE_DIR "/README.md");
  REQUIRE(f);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const std::string begin = "<!-- config-keys:begin -->\n", end = "<!-- config-keys:end -->";
  const size_t b = text.find(begin), e = text.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  REQUIRE(b < e);
  return text.substr(b + begin.size(), e - b - begin.size());
}

}  // namespace

TEST_CASE("config schema: README.md's key table is the generated one") {
  const std::string readme = readme_table(), generated = config_keys_markdown();
  if (readme != generated) {
    std::istringstream a(readme), b(generated);
    std::string la, lb;
    int line = 0;
    while (true) {
      ++line;
      const bool ga = static_cast<bool>(std::getline(a, la));
      const bool gb = static_cast<bool>(std::getline(b, lb));
      if (!ga && !gb) break;
      if (!ga || !gb || la != lb) {
        if (!ga) la = "(end of table)";
        if (!gb) lb = "(end of table)";
        break;
      }
    }
    FAIL("README.md's config key table differs from the declaration in engine/config_schema.cpp "
         "(table line " << line << ")\n  README.md: " << la << "\n  generated: " << lb
         << "\nRegenerate it, from the source directory, with: BUILD_DIR=" << SW_BINARY_DIR
         << " scripts/gen_config_table.sh");
  }
  // Every effective key has a row.
  for (const json& k : effective_keys())
    CHECK_THAT(generated, Contains("| `" + k["key"].get<std::string>() + "` |"));
}

TEST_CASE("config schema: every key is declared with a description and a default") {
  CHECK(declaration().size() > 100);
  for (const json& k : declaration()) {
    INFO(k.dump());
    if (k["compat"].get<bool>()) continue;
    CHECK(!k["doc"].get<std::string>().empty());
    CHECK((!k["default"].is_null() || !k["derived"].get<std::string>().empty()));
  }
}

TEST_CASE("config schema: a default-constructed TrainConfig agrees with the declared defaults") {
  // config_json writes every key of a TrainConfig; parse("{}") fills the declared defaults.
  const TrainConfig d;
  const json code = json::parse(config_json(d));
  const json parsed = json::parse(parse("{}").resolved_json);
  CHECK(code == parsed);
  for (const json& k : effective_keys()) {
    const std::string key = k["key"];
    INFO(key);
    const json* v = at(code, key);
    REQUIRE(v != nullptr);
    if (k["default"].is_null()) continue;  // derived from other keys
    if (key == "activation_checkpointing") {  // written as the object: its mode
      CHECK(*at(code, key + ".mode") == k["default"]);
    } else if (key == "model.qkv_bias" || key == "model.rope_scaling" ||
               (key.rfind("model.rope_", 0) == 0 && key != "model.rope_theta")) {
      CHECK(v->is_null());  // llama's keys: null (not applicable) for the default gpt2
    } else if (key == "optimizer.params.momentum" || key == "optimizer.params.dampening" ||
               key == "optimizer.params.nesterov" || key == "optimizer.params.trust_coefficient" ||
               key == "optimizer.params.max_coeff" || key == "optimizer.params.min_coeff" ||
               key == "optimizer.params.bias_correction") {
      CHECK(v->is_null());  // SGD's, LARS's and Lamb's keys: null (not applicable) for AdamW
    } else if (key == "fp8.amax_history") {  // null (not applicable) without the delayed recipe
      CHECK(v->is_null());
      CHECK(d.sharding.mixed_precision.fp8_amax_history == k["default"].get<int>());
    } else if (key == "shard_group_size") {  // null (not applicable) without HYBRID_SHARD
      CHECK(v->is_null());
      CHECK(d.sharding.shard_group_size == k["default"].get<int>());
    } else {
      CHECK(*v == k["default"]);
    }
  }
}

TEST_CASE("config schema: the resolved config lists every declared key") {
  const std::vector<std::string> configs = {
      "{}",
      R"({"model": {"type": "llama", "n_kv_head": 2}, "scheduler": {"type": "Constant"}})",
      R"({"sharding_strategy": "NO_SHARD", "fp16": {"enabled": true}})",
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01,
          "warmup_min_lr": 0.001}}, "aio": {"thread_count": 2}})",
      R"({"activation_checkpointing": {"mode": "full", "units": [1, 2], "offload": "cpu"},
          "zero_optimization": {"overlap_comm": true, "offload_param": {"device": "nvme",
          "nvme_path": "/tmp/p"}}, "checkpoint": {"resume": "auto"}})",
      R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4})",
  };
  for (const std::string& text : configs) {
    INFO(text);
    const TrainConfig c = parse(text);
    const json r = json::parse(c.resolved_json);
    for (const json& k : effective_keys()) {
      const std::string key = k["key"];
      INFO(key);
      CHECK(at(r, key) != nullptr);
    }
    for (const json& k : declaration())  // aliases are resolved into their keys
      if (k["alias"].get<bool>()) CHECK(at(r, k["key"].get<std::string>()) == nullptr);
    // ... and the resolved config reads back to itself (null: not set).
    CHECK(parse_config(c.resolved_json, "resolved.json").resolved_json == c.resolved_json);
  }
  // What applies in one run and not another is null, and reads back as unset.
  const json llama = json::parse(parse(R"({"model": {"type": "llama"},
                                          "scheduler": {"type": "Constant"}})").resolved_json);
  CHECK(*at(llama, "model.tie_embeddings") == false);  // llama's default (gpt2's: true)
  CHECK(at(llama, "model.rope_factor")->is_null());     // no llama3 scaling
  CHECK(at(llama, "scheduler.params.warmup_num_steps")->is_null());
  CHECK(at(llama, "shard_group_size")->is_null());
  CHECK(at(llama, "train_batch_size")->is_null());
}

TEST_CASE("config schema: the reader enforces the declared ranges and choices") {
  for (const json& k : declaration()) {
    if (k["compat"].get<bool>()) continue;
    const std::string key = k["key"];
    INFO(key);
    std::vector<std::string> bad;  // --set values outside the declaration
    if (k.contains("min")) bad.push_back(key + "=" + std::to_string(k["min"].get<long long>() - 1));
    if (k.contains("max") && k["max"].get<long long>() < 2147483647)
      bad.push_back(key + "=" + std::to_string(k["max"].get<long long>() + 1));
    if (k.contains("range") && k["kind"] == "a number") {
      const json& r = k["range"];  // [open, lo, hi, close]
      if (!r[1].is_null())
        bad.push_back(key + "=" + json(r[0] == "(" ? r[1].get<double>()
                                                   : r[1].get<double>() - 1).dump());
      if (!r[2].is_null())
        bad.push_back(key + "=" + json(r[2].get<double>() + 1).dump());
    }
    if (k.contains("choices")) bad.push_back(key + "=no_such_choice");
    // activation_checkpointing's keys need a mode to be read at all.
    const std::string base = key.rfind("activation_checkpointing.", 0) == 0
                                 ? R"({"activation_checkpointing": {"mode": "full"}})"
                                 : "{}";
    for (const std::string& ov : bad) {
      INFO(ov);
      CHECK_THAT(error_of(base, {ov}), Contains("config: cfg.json: " + key + ": "));
    }
  }
  // Messages keep their form: the key path, the declared range, the value.
  CHECK(error_of(R"({"model": {"vocab_size": 2147483648}})") ==
        "config: cfg.json: model.vocab_size: must be <= 2147483647 (got 2147483648)");
  CHECK(error_of(R"({"zero_optimization": {"stage": 4}})") ==
        "config: cfg.json: zero_optimization.stage: must be in [0, 3] (got 4)");
  CHECK(error_of(R"({"optimizer": {"params": {"lr": 0}}})") ==
        "config: cfg.json: optimizer.params.lr: must be > 0 (got 0)");
  CHECK(error_of(R"({"model": {"type": "bert"}})") ==
        "config: cfg.json: model.type: 'bert' is not one of gpt2, llama");
}

TEST_CASE("config schema: the aio block's declared ranges are what AioConfig::from_json checks") {
  // aio is read by offload/aio.cpp (a lower layer): its checks must match the declaration.
  int checked = 0;
  for (const json& k : declaration()) {
    const std::string key = k["key"];
    if (key.rfind("aio.", 0) != 0 || !k.contains("min")) continue;
    const std::string name = key.substr(4);
    INFO(key);
    const long long lo = k["min"], hi = k["max"];
    CHECK_NOTHROW(AioConfig::from_json(json{{name, lo}}, "aio"));
    CHECK_NOTHROW(AioConfig::from_json(json{{name, hi}}, "aio"));
    CHECK_THROWS_AS(AioConfig::from_json(json{{name, lo - 1}}, "aio"), Error);
    CHECK_THROWS_AS(AioConfig::from_json(json{{name, hi + 1}}, "aio"), Error);
    ++checked;
  }
  CHECK(checked == 4);  // block_size, queue_depth, intra_op_parallelism, thread_count
  for (const json& k : declaration())
    if (k["key"] == "aio.backend")
      for (const json& choice : k["choices"])
        CHECK_NOTHROW(AioConfig::from_json(json{{"backend", choice}}, "aio"));
}
