// Config key activation_checkpointing: the string and object forms land in
// TrainConfig.sharding.activation_checkpointing, mistakes name the key, DeepSpeed's keys stay
// accepted (compatibility note), and config_json round-trips every form.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "engine/config.h"
#include "engine_test_util.h"

using namespace sw;
using Catch::Matchers::Contains;

namespace {
using enginetest::error_of;
using enginetest::parse;
const ActivationCheckpointing& ac(const TrainConfig& c) {
  return c.sharding.activation_checkpointing;
}
}  // namespace

TEST_CASE("config: activation_checkpointing forms", "[config][checkpointing]") {
  CHECK(ac(parse("{}")).mode == CheckpointMode::Off);
  CHECK(ac(parse(R"({"activation_checkpointing": "full"})")).mode == CheckpointMode::Full);
  CHECK(ac(parse(R"({"activation_checkpointing": "selective"})")).mode ==
        CheckpointMode::Selective);
  CHECK(ac(parse(R"({"activation_checkpointing": "off"})")).mode == CheckpointMode::Off);
  const TrainConfig e = parse(R"({"activation_checkpointing": {"mode": "full", "every": 2}})");
  CHECK(ac(e).mode == CheckpointMode::Full);
  CHECK(ac(e).every == 2);
  CHECK(ac(e).units.empty());
  const TrainConfig u =
      parse(R"({"model": {"n_layer": 4}, "activation_checkpointing": {"mode": "selective", "units": [1, 3]}})");
  CHECK(ac(u).mode == CheckpointMode::Selective);
  CHECK(ac(u).units == std::vector<int>{1, 3});
  // --set works on both forms.
  CHECK(ac(parse("{}", {"activation_checkpointing=selective"})).mode == CheckpointMode::Selective);
  CHECK(ac(parse("{}", {"activation_checkpointing.mode=full"})).mode == CheckpointMode::Full);
  // DeepSpeed's block alone: accepted with a note, no checkpointing.
  const TrainConfig ds = parse(R"({"activation_checkpointing": {"partition_activations": true}})");
  CHECK(ac(ds).mode == CheckpointMode::Off);
  REQUIRE(ds.notes.size() == 1);
  CHECK_THAT(ds.notes[0], Contains("activation_checkpointing.partition_activations"));
  // ... and next to ours.
  const TrainConfig both = parse(
      R"({"activation_checkpointing": {"mode": "full", "cpu_checkpointing": false}})");
  CHECK(ac(both).mode == CheckpointMode::Full);
}

TEST_CASE("config: activation_checkpointing mistakes name the key", "[config][checkpointing]") {
  CHECK_THAT(error_of(R"({"activation_checkpointing": "fulll"})"),
             Contains("activation_checkpointing") && Contains("'fulll' is not one of off, full, selective"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": true})"),
             Contains("cfg.json: activation_checkpointing: expected") && Contains("got boolean true"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"mode": "sel"}})"),
             Contains("activation_checkpointing.mode"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"every": 2}})"),
             Contains("activation_checkpointing.mode") && Contains("required"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"mode": "full", "every": 0}})"),
             Contains("activation_checkpointing.every"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"mode": "full", "every": 2, "units": [1]}})"),
             Contains("activation_checkpointing.units") && Contains("conflicts"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"mode": "full", "units": []}})"),
             Contains("activation_checkpointing.units") && Contains("non-empty array"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"mode": "full", "units": "1"}})"),
             Contains("activation_checkpointing.units"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"mode": "full", "units": [1, "a"]}})"),
             Contains("activation_checkpointing.units[1]"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"mode": "full", "units": [1, 1]}})"),
             Contains("activation_checkpointing.units[1]") && Contains("twice"));
  // GPT-2 with 4 layers has units 0..4; Llama 0..5; blocks_per_unit 2 merges blocks.
  CHECK_THAT(error_of(R"({"model": {"n_layer": 4}, "activation_checkpointing": {"mode": "full", "units": [5]}})"),
             Contains("activation_checkpointing.units[0]") && Contains("[0, 4]"));
  CHECK_NOTHROW(parse(R"({"model": {"type": "llama", "n_layer": 4}, "activation_checkpointing": {"mode": "full", "units": [5]}})"));
  CHECK_THAT(error_of(R"({"model": {"n_layer": 4}, "blocks_per_unit": 2, "activation_checkpointing": {"mode": "full", "units": [3]}})"),
             Contains("[0, 2]"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"mode": "full", "evry": 2}})"),
             Contains("activation_checkpointing.evry") && Contains("every"));
}

TEST_CASE("config: activation_checkpointing round-trips through config_json",
          "[config][checkpointing]") {
  for (const char* text :
       {R"({})", R"({"activation_checkpointing": "full"})",
        R"({"activation_checkpointing": "selective"})",
        R"({"activation_checkpointing": {"mode": "full", "every": 3}})",
        R"({"model": {"n_layer": 4}, "activation_checkpointing": {"mode": "selective", "units": [0, 2]}})",
        R"({"activation_checkpointing": {"mode": "full", "partition_activations": false}})"}) {
    INFO(text);
    const TrainConfig a = parse(text);
    const TrainConfig b = parse_config(config_json(a), "x");
    CHECK(ac(b).mode == ac(a).mode);
    CHECK(ac(b).every == ac(a).every);
    CHECK(ac(b).units == ac(a).units);
    CHECK(config_json(b) == config_json(a));
    const TrainConfig r = parse_config(a.resolved_json, "resolved");
    CHECK(ac(r).mode == ac(a).mode);
    CHECK(ac(r).units == ac(a).units);
  }
  // A TrainConfig built in code.
  TrainConfig c;
  c.sharding.activation_checkpointing.mode = CheckpointMode::Selective;
  c.sharding.activation_checkpointing.every = 2;
  const TrainConfig b = parse_config(config_json(c), "x");
  CHECK(ac(b).mode == CheckpointMode::Selective);
  CHECK(ac(b).every == 2);
}
