// The config keys' one declaration (schema(), engine/config_schema.cpp) and the types it is
// written in. Each key is a Node: its JSON kind, range or allowed strings, default, one line of
// description, and how it binds to its TrainConfig field (Binding). The reader
// (config_reader.cpp), the resolved config (config_writer.cpp), the checks of a TrainConfig
// (config_validate.cpp) and README.md's key table (config_markdown.cpp) all walk this one tree,
// so a new key is one declaration plus the code that uses it.
//
// Internal to the engine's config files; the API is engine/config.h.
#pragma once
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/config.h"

namespace sw::config {

using json = nlohmann::json;

enum class Kind { Obj, Int, Num, Bool, Str, Betas, Any };

constexpr double kInf = INFINITY;
constexpr long long IMAX = INT32_MAX;  // an integer range up to it reads ">= lo"

// Range for numbers: lo/hi with open or closed ends.
struct Range {
  double lo, hi;
  bool lo_open, hi_open;
  std::string str() const;  // "> 0", ">= 0", "[0, 1)", ...
  bool ok(double x) const {
    return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
};
constexpr Range kPositive{0, kInf, true, false};     // > 0
constexpr Range kNonNegative{0, kInf, false, false};  // >= 0
constexpr Range kUnit{0, 1, false, false};            // [0, 1]

struct Ctx;  // config_text.h: the file's name and the --set origins, for messages
struct Node;

// How a declared key binds to TrainConfig. Each part may be empty:
//   read     stores the key's value into the field: a value given (not null, not "auto", of
//            the declared kind), or the declared default when the key is absent; checks the
//            declared range on the value as written. Empty: config_reader.cpp reads the key
//            (a rule between keys, an alias, a form of its own).
//   write    the field's effective value as the resolved config shows it (null: not applicable).
//   checked  validate_config applies the declared range or choices to write()'s value (a config
//            built in code has not been through read).
//   applies  false: the key does not apply to this config (a parameter of another scheduler
//            type, ...): the resolved config writes null and validation skips it.
struct Binding {
  std::function<void(TrainConfig&, const json& v, const Node& n, const std::string& path,
                     const Ctx&)>
      read;
  std::function<json(const TrainConfig&)> write;
  bool checked = true;
  std::function<bool(const TrainConfig&)> applies;
};

struct Node {
  std::string name;
  Kind kind = Kind::Any;
  std::vector<Node> kids;  // Kind::Obj (and Kind::Any values that may be objects)
  bool compat = false;     // accepted for DeepSpeed compatibility; no effect yet (a note)
  bool auto_ok = false;    // accepts Hugging Face's "auto"
  // Another spelling of a key that is declared too (the resolved config writes that one).
  bool alias = false;
  bool int_range = false;  // lo/hi apply (Kind::Int always; Kind::Any when declared)
  long long lo = 0, hi = IMAX;             // Kind::Int (and integer Kind::Any values)
  Range range{-kInf, kInf, false, false};  // Kind::Num; Kind::Betas: each element
  std::vector<std::string> choices;        // Kind::Str: the accepted strings (empty: any)
  json def;              // the default; null when there is none or it is derived (below)
  std::string derived;   // the default in words when def is null
  std::string accepts;   // Kind::Any: the accepted values in words
  std::string doc;       // one line for README's key table
  Binding bind;
  const Node* kid(const std::string& k) const {
    for (const Node& n : kids)
      if (n.name == k) return &n;
    return nullptr;
  }
};

// The root of the declaration.
const Node& schema();
// The declared node at a dotted key path (std::logic_error when there is none: a programming
// error).
const Node& decl(const std::string& path);
// Calls fn(node, path) for every declared node below `n`, depth first, in declaration order.
void for_each_key(const Node& n, const std::string& path,
                  const std::function<void(const Node&, const std::string&)>& fn);

// ---- Values (config_values.cpp) ----------------------------------------------------------

std::string num_str(double v);
std::string num_str(float v);
std::string join_path(const std::string& parent, const std::string& key);
const char* kind_name(Kind k);
bool kind_matches(Kind k, const json& v);
bool is_auto(const json& v);
// "string \"x\"", "number 3", "an object", ...: a value in a message.
std::string describe(const json& v);
// A float written back as the shortest decimal that reads back as the same float.
json fjson(float f);
// The value at a dotted path of `root`, or nullptr.
const json* at(const json& root, const std::string& path);

// A value of key `path` (declared as `n`) checked against the declaration; a value outside it
// throws the config's one line, "config: <source>: <path>: must be ... (got ...)".
long long read_int(const Node& n, const json& v, const std::string& path, const Ctx& c);
double read_num(const Node& n, const json& v, const std::string& path, const Ctx& c);
std::string read_str(const Node& n, const json& v, const std::string& path, const Ctx& c);
// x within r (a range that depends on other keys, within the declared one).
double check_num(double x, const std::string& path, Range r, const Ctx& c);
// A float field: the range must still hold after rounding to float (1e300 would become inf,
// 1e-50 zero, a beta of 0.9999999999 exactly 1).
float to_float(double x, const std::string& path, Range r, const Ctx& c);
// The declared range or choices of `n` applied to `v` (null and "auto" pass).
void check_value(const Node& n, const json& v, const std::string& path, const Ctx& c);

// The derived defaults of checkpoint.dir and profile.out.
std::string default_checkpoint_dir(const std::string& run_dir);
std::string default_profile_dir(const std::string& run_dir);

// Keys with a form of their own (their Binding::read).
uint64_t read_seed(const Node& n, const json& v, const std::string& path, const Ctx& c);
int read_prefetch(const Node& n, const json& v, const std::string& path, const Ctx& c);
size_t read_budget(const Node& n, const json& v, const std::string& path, const Ctx& c);
std::vector<int> read_split_points(const Node& n, const json& v, const std::string& path,
                                   const Ctx& c);

// ---- The passes over the declaration, each in its file ---------------------------------------

// config_validate.cpp: the checks every TrainConfig passes, the reader's last step and
// validate_config's: the declared ranges and choices of its fields, the rules between keys,
// the sharding policy's own. world: the ranks of the run.
void check_config(const TrainConfig& cfg, int world, const Ctx& c);
// config_validate.cpp: micro batch x accumulation x world at most 2^31 - 1 rows, else the error
// names `key` (the reader names the batch key the file gave).
void check_global_batch(long long mb, long long ga, int world, const std::string& key,
                        const Ctx& c);
// config_validate.cpp: the short forms a TrainConfig built in code may use, resolved into the
// fields a reader sets (validate_config's first step; the writer writes a resolved copy).
void resolve_code_forms(TrainConfig& cfg);
// config_writer.cpp: every declared key of `cfg` into `r`, with its effective value (other keys
// of r, the compatibility-only ones, are kept; aliases are removed).
void write_resolved(json& r, const TrainConfig& cfg);

}  // namespace sw::config
