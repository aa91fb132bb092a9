// A config as text: JSON parsed with positions (line:column on syntax errors, duplicate keys
// refused), --set overrides applied by key path, and the messages that name the file, the key
// path and where a value came from (Ctx). Unknown keys are answered with the closest declared
// one. Internal to the engine's config files; the API is engine/config.h.
#pragma once
#include <map>
#include <string>

#include "engine/config_schema.h"

namespace sw::config {

// Where messages point: the config's name and, for each key set with --set, the override.
struct Ctx {
  std::string source;
  std::map<std::string, std::string> origins;  // key path -> " (from --set ...)"
  // The JSON the config is read from (null for a TrainConfig built in code): a rule between
  // keys names the one that was given.
  const json* input = nullptr;
  // Whether the input sets `path` (not null, not "auto").
  bool given(const std::string& path) const;
  // " (from --set ...)" when `path` or an object above it was set by an override, else "".
  std::string origin(const std::string& path) const;
  // Throws sw::Error("config: <source>: <path>: <problem>[ (from --set ...)]").
  [[noreturn]] void bad(const std::string& path, const std::string& problem) const;
};

// `text` as a JSON object; syntax errors give source:line:column, duplicate keys and a top
// level that is not an object are refused.
json parse_text(const std::string& text, const std::string& source);

// "a.b.c=value" into `root`: the value parsed as JSON if it parses, else taken as a string;
// the key path must be declared (intermediate objects are created). Records the origin.
void apply_override(json& root, const std::string& ov, Ctx& c);

// Throws the unknown-key message for `key` under `parent` (declared as `level`), suggesting the
// nearest key there, or where a key of that name is declared, or listing the valid keys.
[[noreturn]] void unknown_key(const std::string& source, const Node& level,
                              const std::string& parent, const std::string& key,
                              const std::string& origin);

}  // namespace sw::config
