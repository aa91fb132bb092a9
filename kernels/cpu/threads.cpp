#include "kernels/threads.h"

#include <omp.h>

#include <cstdlib>
#include <string>
#include <thread>

extern "C" void openblas_set_num_threads(int);

namespace sw {

namespace {
int g_threads = 0;

int local_ranks() {
  // OpenMPI and Slurm both say how many ranks share this node.
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v)) {
      const int n = std::atoi(s);
      if (n > 0) return n;
    }
  return 1;
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
