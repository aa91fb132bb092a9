// A run's configuration made in code: the keys of a JSON config file (README.md lists them),
// set by their dotted paths, so that a run built in C++ and one read from a file are the same
// run. It is read exactly as a file is: the same defaults, checks and one-line errors, which
// name the key ("config: RunConfig: optimizer.params.lr: ...").
//
//   sw::RunConfig cfg;
//   cfg.set("model.type", "llama").set("model.n_layer", 2).set("data.train", "train.bin")
//       .set("train_steps", 100).set("optimizer.params.lr", 1e-3);
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sw {

class RunConfig {
 public:
  RunConfig() = default;
  // Starts from a JSON document (a config file's text); set() then overrides its keys.
  static RunConfig from_json(const std::string& json_text);

  // key: a dotted path ("zero_optimization.stage"); objects on the way are created. A later
  // set() of the same key replaces the earlier value.
  RunConfig& set(const std::string& key, const std::string& value);
  RunConfig& set(const std::string& key, const char* value);
  RunConfig& set(const std::string& key, bool value);
  RunConfig& set(const std::string& key, int value);
  RunConfig& set(const std::string& key, int64_t value);
  RunConfig& set(const std::string& key, uint64_t value);  // (seed)
  RunConfig& set(const std::string& key, double value);
  // A value given as JSON text: an array, an object, null ("[4, 8]", "{\"mode\": \"full\"}").
  RunConfig& set_json(const std::string& key, const std::string& json_value);

  // The whole document, as a config file holding it would read. Throws sw::Error
  // ("config: RunConfig: ...") on malformed JSON or a key path through a non-object.
  std::string to_json() const;
  // What messages call it ("RunConfig" unless set).
  const std::string& source() const { return source_; }
  RunConfig& set_source(std::string name) {
    source_ = std::move(name);
    return *this;
  }

 private:
  std::string base_ = "{}";                                  // from_json's document
  std::vector<std::pair<std::string, std::string>> keys_;  // (path, JSON value), in order
  std::string source_ = "RunConfig";
};

}  // namespace sw
