#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace sw {

namespace {
int g_rank = -1;
}

void set_error_rank(int rank) { g_rank = rank; }
int error_rank() { return g_rank; }

void fail(const std::string& component, const std::string& message) {
  throw Error(component + ": " + message);
}

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  if (g_rank >= 0)
    std::fprintf(stderr, "shardwise: internal error on rank %d at %s:%d: %s (%s)\n", g_rank, file,
                 line, msg.c_str(), expr);
  else
    std::fprintf(stderr, "shardwise: internal error at %s:%d: %s (%s)\n", file, line, msg.c_str(),
                 expr);
  std::fflush(stderr);
  std::abort();
}

}  // namespace sw
