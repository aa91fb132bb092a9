#include "kernels/threads.h"

#include <omp.h>

#include <string>
#include <thread>

#include "core/launch.h"

extern "C" void openblas_set_num_threads(int);

namespace sw {

namespace {
int g_threads = 0;

// Ranks sharing this node, as the launcher says (core/launch.h); 1 when it does not say.
int local_ranks() {
  const int n = launch_env().local_size;
  return n > 0 ? n : 1;
}
}  // namespace

void set_num_threads(int n) {
  if (n <= 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    n = cores / local_ranks();
    if (n < 1) n = 1;
  }
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() {
  if (g_threads == 0) set_num_threads(0);
  return g_threads;
}

}  // namespace sw
