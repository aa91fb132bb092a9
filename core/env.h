// The environment switches: every variable Shardwise reads (all named SHARDWISE_*) is declared
// once in core/env.cpp with its kind, accepted values, default and one line of description.
// The typed readers below take only declared names of their kind, so a new switch cannot be
// read without being declared, and README.md's switch table (env_vars_markdown, printed by
// tools/config_table --env) comes from the same declaration. Third-party variables (the
// launcher's OMPI_* / PMI_* / SLURM_*, OPENBLAS_CORETYPE, HOME, XDG_CACHE_HOME) are not ours
// and are read where they are needed.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sw {

enum class EnvKind : uint8_t {
  Flag,     // off unless set to a value other than "", "0", "off" or "false"
  Switch,   // on unless set to "0", "off" or "false"
  Integer,  // a whole number within the declared range
  Number,   // a number within the declared range
  Text,     // a string (a path, a choice among listed values, ...)
};

struct EnvVar {
  const char* name;
  EnvKind kind;
  const char* values;    // the accepted values in words ("" = what the kind says)
  const char* fallback;  // what applies when it is not set, in words
  const char* use;       // "run" (users), "debug" (diagnosing a run), "test" (the test suite)
  const char* doc;       // one line for the table
  double lo = 0, hi = 0;  // Integer / Number: the accepted range
};

// Every declared variable, in the table's order.
const std::vector<EnvVar>& env_vars();
// The declaration of `name`; throws std::logic_error for an undeclared name (a programming
// error: declare it in core/env.cpp).
const EnvVar& env_var(const char* name);

// The readers; each throws std::logic_error for a name not declared with its kind.
bool env_flag(const char* name);
bool env_switch(const char* name);
// The value when set and not empty, else nullopt.
std::optional<std::string> env_text(const char* name);
// The value when set and not empty, else nullopt. A value that is not a number in the declared
// range throws sw::Error("env: NAME='value': expected ...").
std::optional<int64_t> env_int(const char* name);
std::optional<double> env_number(const char* name);

// The Markdown table README.md holds between its env-switches markers.
std::string env_vars_markdown();

}  // namespace sw
