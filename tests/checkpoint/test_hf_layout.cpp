// The ModelConfig in safetensors metadata and checkpoints (checkpoint/hf_layout.h): the Llama
// variants' fields round-trip, and files from before them still read (their llama models were
// untied whatever tie_embeddings said, with plain RoPE).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "checkpoint/hf_layout.h"
#include "core/error.h"

using namespace sw;

TEST_CASE("hf layout: the Llama variants' config fields round-trip, old files still read") {
  ModelConfig c;
  c.type = "llama";
  c.tie_embeddings = true;
  c.qkv_bias = true;
  c.rope_scaling = "llama3";
  c.rope_factor = 32.f, c.rope_low_freq_factor = 2.f, c.rope_high_freq_factor = 8.f;
  c.rope_original_max_pos = 4096;
  c.hf_architecture = "Qwen2ForCausalLM";
  const nlohmann::json j = nlohmann::json::parse(model_config_to_json(c).dump());
  const ModelConfig r = model_config_from_json(j, "m.safetensors");
  CHECK(model_config_to_json(r) == model_config_to_json(c));

  // A file written before issue 35: no qkv_bias, rope_* or hf_architecture, and a llama's
  // tie_embeddings true (the struct's default, which llama then ignored).
  nlohmann::json old = j;
  for (const char* k : {"qkv_bias", "rope_scaling", "rope_factor", "rope_low_freq_factor",
                        "rope_high_freq_factor", "rope_original_max_pos", "hf_architecture"})
    old.erase(k);
  const ModelConfig o = model_config_from_json(old, "old.safetensors");
  CHECK(!o.tied());
  CHECK(!o.qkv_bias);
  CHECK(o.rope_scaling == "none");
  CHECK(o.hf_architecture.empty());
  old["type"] = "gpt2";  // GPT-2 keeps its tie
  CHECK(model_config_from_json(old, "old.safetensors").tied());

  nlohmann::json bad = j;
  bad["rope_scaling"] = "yarn";
  try {
    model_config_from_json(bad, "m.safetensors");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("m.safetensors: model_config.rope_scaling"));
  }
}
