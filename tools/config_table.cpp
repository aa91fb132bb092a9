// Prints the configuration key table that README.md holds between its config-keys markers,
// generated from the key declaration in engine/config.cpp. scripts/gen_config_table.sh puts it
// into README.md; test_config_schema checks that README.md agrees.
#include <cstdio>

#include "engine/config.h"

int main() {
  std::fputs(sw::config_keys_markdown().c_str(), stdout);
  return 0;
}
