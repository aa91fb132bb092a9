#include "core/launch.h"

#include <cstdlib>
#include <initializer_list>

namespace sw {

namespace {
// The first of `vars` that is set with a value >= lo (atoi: a leading number, as launchers write
// them; "2(x3)" reads 2); `dflt` when none is.
int first_env(std::initializer_list<const char*> vars, int lo, int dflt) {
  for (const char* var : vars)
    if (const char* v = std::getenv(var); v && *v) {
      const int n = std::atoi(v);
      if (n >= lo) return n;
    }
  return dflt;
}
}  // namespace

LaunchEnv launch_env() {
  LaunchEnv e;
  e.world_size = first_env({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}, 1, 1);
  e.rank = first_env({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}, 0, 0);
  e.local_size = first_env(
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}, 1, 0);
  e.local_rank =
      first_env({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}, 0, 0);
  return e;
}

}  // namespace sw
