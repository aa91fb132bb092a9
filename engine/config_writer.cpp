// Writing a config: TrainConfig to the resolved JSON through the declaration
// (config_schema.h). Every declared key gets its effective value, the one its binding writes
// (null where the key does not apply to the run), so the run directory's config.json lists the
// whole configuration and reads back to the same TrainConfig.
#include <sstream>

#include "engine/config.h"
#include "engine/config_schema.h"

namespace sw {
namespace config {

namespace {

void set_path(json& root, const std::string& path, json v) {
  json* cur = &root;
  std::stringstream ss(path);
  std::string k;
  std::vector<std::string> parts;
  while (std::getline(ss, k, '.')) parts.push_back(k);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    json& next = (*cur)[parts[i]];
    if (!next.is_object()) next = json::object();
    cur = &next;
  }
  (*cur)[parts.back()] = std::move(v);
}

void erase_path(json& root, const std::string& path) {
  const size_t dot = path.rfind('.');
  json* parent =
      dot == std::string::npos ? &root : const_cast<json*>(at(root, path.substr(0, dot)));
  if (parent && parent->is_object())
    parent->erase(path.substr(dot == std::string::npos ? 0 : dot + 1));
}

// activation_checkpointing: "auto", else the object with every key (an object given in the
// input keeps its DeepSpeed keys).
void write_activation_checkpointing(json& r, const TrainConfig& cfg) {
  const std::string key = "activation_checkpointing";
  if (cfg.autoplan.checkpointing) {
    set_path(r, key, "auto");
    return;
  }
  const ActivationCheckpointing& ac = cfg.sharding.activation_checkpointing;
  if (const json* given = at(r, key); !(given && given->is_object()))
    set_path(r, key, json::object());
  set_path(r, key + ".mode", checkpoint_mode_name(ac.mode));
  set_path(r, key + ".every", ac.units.empty() ? json(ac.every) : json());
  set_path(r, key + ".units", ac.units.empty() ? json() : json(ac.units));
  set_path(r, key + ".offload", ac.offload_cpu ? "cpu" : ac.offload_nvme ? "nvme" : "none");
  set_path(r, key + ".nvme_path", ac.nvme_path);
}

}  // namespace

// Any two of the three batch keys give the third with the world size: the resolved config
// keeps micro batch and accumulation (train_batch_size null), so it reads at another world
// size too. tests/engine/test_config_schema.cpp checks that every declared key is written.
void write_resolved(json& r, const TrainConfig& given) {
  TrainConfig cfg = given;  // a config built in code may use short forms
  resolve_code_forms(cfg);
  for_each_key(schema(), "", [&](const Node& n, const std::string& path) {
    if (n.alias) {  // resolved into the key it is another name of
      erase_path(r, path);
      return;
    }
    if (!n.bind.write) return;
    const bool applies = !n.bind.applies || n.bind.applies(cfg);
    set_path(r, path, applies ? n.bind.write(cfg) : json());
  });
  write_activation_checkpointing(r, cfg);
}

}  // namespace config

std::string config_json(const TrainConfig& cfg) {
  config::json r = config::json::object();
  config::write_resolved(r, cfg);
  return r.dump(2) + "\n";
}

}  // namespace sw
