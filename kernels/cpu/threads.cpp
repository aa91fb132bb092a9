#include "kernels/threads.h"

#include <omp.h>

#include <algorithm>
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

int threads_for(int n, int local_ranks) {
  if (n <= 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    n = cores / std::max(1, local_ranks);
    if (n < 1) n = 1;
  }
  // OMP_THREAD_LIMIT caps every parallel region, so ask for no more. OpenBLAS's OpenMP build
  // splits a GEMM into as many pieces as it is told, and the pieces wait on each other: told 2
  // under a limit of 1, the one thread running the first piece spins forever on the second
  // (scripts/test.sh --sanitize=thread runs with OMP_THREAD_LIMIT=1).
  return std::min(n, omp_get_thread_limit());
}

void set_num_threads(int n) {
  n = threads_for(n, local_ranks());
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() {
  if (g_threads == 0) set_num_threads(0);
  return g_threads;
}

}  // namespace sw
