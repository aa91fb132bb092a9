// What the launcher (mpirun, srun, hydra) says about this process, read from its environment
// without initialising MPI. The one place that knows the variable names.
//
// Precedence, the same for every field: OpenMPI (OMPI_COMM_WORLD_*), then MPICH/Hydra (PMI_*,
// MPI_LOCAL*), then PMIx (PMIX_RANK), then Slurm (SLURM_*). The first variable that is set and
// parses as a number in range wins (world and local sizes >= 1, ranks >= 0), so mpirun inside a
// Slurm allocation reports mpirun's view, not the allocation's.
#pragma once

namespace sw {

struct LaunchEnv {
  int world_size = 1;  // OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_STEP_NUM_TASKS (1 = no launcher)
  int rank = 0;        // OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, SLURM_PROCID
  int local_size = 0;  // ranks on this node: OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS,
                       // SLURM_NTASKS_PER_NODE (0 = unknown)
  int local_rank = 0;  // OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID
};

// Reads the environment each call (cheap; tests change it).
LaunchEnv launch_env();

}  // namespace sw
