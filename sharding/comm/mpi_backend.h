// The MPI backend's entry points (internal to sharding/comm; only mpi_group.cpp includes mpi.h).
#pragma once
#include "sharding/comm/group.h"

namespace sw::comm {

// Initialises MPI if needed and returns a new group over a duplicate of MPI_COMM_WORLD.
GroupPtr make_mpi_world();
// MPI_COMM_WORLD rank, or -1 when MPI is not initialised.
int mpi_rank_if_initialized();
// MPI_Abort(MPI_COMM_WORLD, code) when MPI is initialised; returns otherwise.
void mpi_abort_if_initialized(int code);

}  // namespace sw::comm
