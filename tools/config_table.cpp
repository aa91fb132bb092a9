// Prints a table README.md holds between its markers, generated from a declaration:
//   config_table        the configuration keys (engine/config_schema.cpp), config-keys markers;
//   config_table --env  the environment switches (core/env.cpp), env-switches markers.
// scripts/gen_config_table.sh puts both into README.md; test_config_schema and test_env check
// that README.md agrees.
#include <cstdio>
#include <cstring>

#include "core/env.h"
#include "engine/config.h"

int main(int argc, char** argv) {
  const bool env = argc > 1 && std::strcmp(argv[1], "--env") == 0;
  if (argc > 2 || (argc == 2 && !env)) {
    std::fputs("usage: config_table [--env]\n", stderr);
    return 2;
  }
  std::fputs(env ? sw::env_vars_markdown().c_str() : sw::config_keys_markdown().c_str(), stdout);
  return 0;
}
