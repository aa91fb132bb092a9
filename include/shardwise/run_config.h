/// @file
/// @brief A run's configuration made in code: the keys of a JSON config file.
///
/// The keys are a config file's (README.md lists them), set by their dotted paths, so that a
/// run built in C++ and one read from a file are the same run. It is read exactly as a file
/// is: the same defaults, checks and one-line errors, which name the key
/// (`config: RunConfig: optimizer.params.lr: ...`).
///
/// @code
///   sw::RunConfig cfg;
///   cfg.set("model.type", "llama").set("model.n_layer", 2).set("data.train", "train.bin")
///       .set("train_steps", 100).set("optimizer.params.lr", 1e-3);
/// @endcode
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sw {

/// A config document built key by key; sw::Trainer reads it.
class RunConfig {
 public:
  RunConfig() = default;
  /// Starts from a JSON document (a config file's text); set() then overrides its keys.
  static RunConfig from_json(const std::string& json_text);

  /// Sets `key`, a dotted path ("zero_optimization.stage"), creating the objects on the way;
  /// a later set() of the same key replaces the earlier value.
  RunConfig& set(const std::string& key, const std::string& value);
  /// @copydoc set(const std::string&, const std::string&)
  RunConfig& set(const std::string& key, const char* value);
  /// @copydoc set(const std::string&, const std::string&)
  RunConfig& set(const std::string& key, bool value);
  /// @copydoc set(const std::string&, const std::string&)
  RunConfig& set(const std::string& key, int value);
  /// @copydoc set(const std::string&, const std::string&)
  RunConfig& set(const std::string& key, int64_t value);
  /// @copydoc set(const std::string&, const std::string&)
  RunConfig& set(const std::string& key, uint64_t value);
  /// @copydoc set(const std::string&, const std::string&)
  RunConfig& set(const std::string& key, double value);
  /// Sets `key` to a value given as JSON text: an array, an object, null ("[4, 8]",
  /// "{\"mode\": \"full\"}").
  RunConfig& set_json(const std::string& key, const std::string& json_value);

  /// The whole document, as a config file holding it would read. Throws sw::Error
  /// ("config: RunConfig: ...") on malformed JSON or a key path through a non-object.
  std::string to_json() const;
  /// What messages call the document ("RunConfig" unless set_source() named it).
  const std::string& source() const { return source_; }
  /// Names the document in messages.
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
